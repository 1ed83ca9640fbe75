"""``torch.nn.MultiheadAttention`` as slimming cuts it. Torch's functional form
(``F.multi_head_attention_forward``) takes every width from the query's: the queries, keys and
values must be as wide as the tokens they are made from, and ``head_dim`` is that width over
``num_heads``. A cut that removes whole heads, or channels of the tokens around the attention,
breaks that. ``MultiheadAttention`` here is the same module (the same parameters and
state_dict keys, the same arguments and results) whose forward computes the same thing in the
steps a transformer written by hand takes (one packed projection, a reshape into
``num_heads`` heads of ``head_dim``, attention, ``out_proj``), so that its widths may differ.

The trace runs every ``nn.MultiheadAttention`` of a network as this one (``decomposed``) and
follows its channels and heads as it follows timm's attention; the pruned network's attentions
whose widths the cut changed are this class (``thinned``), and ``load_pruned`` gives a fresh
instance's the same. Calls it does not decompose (keys and values other than the query,
separate projection weights, ``add_bias_kv``, ``add_zero_attn``) run torch's own forward: the
trace does not follow their channels, which are then kept.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn


class MultiheadAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` whose tokens, queries, keys and values, and output may have
    widths of their own (``in_proj_weight``: (3 * num_heads * head_dim, tokens' width);
    ``out_proj``: num_heads * head_dim -> its output's width)."""

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if not self.decomposes(query, key, value):
            return super().forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                   average_attn_weights, is_causal)
        batched = query.dim() == 3
        x = query if not batched else query if self.batch_first else query.transpose(0, 1)
        if not batched:
            x = x.unsqueeze(0)
        b, n = x.shape[:2]
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)
        q, k, v = qkv.reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        mask, causal = self._mask(key_padding_mask, attn_mask, need_weights, is_causal, b, n, q.dtype)
        p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            scores = (q * self.head_dim ** -0.5) @ k.transpose(-2, -1)
            if mask is not None:
                scores = scores + mask
            weights = F.dropout(scores.softmax(dim=-1), p) if p > 0 else scores.softmax(dim=-1)
            out = weights @ v
            weights = weights.mean(dim=1) if average_attn_weights else weights
            if not batched:
                weights = weights.squeeze(0)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)
        out = self.out_proj(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))
        if not batched:
            return out.squeeze(0), weights
        return (out if self.batch_first else out.transpose(0, 1)), weights

    def decomposes(self, query, key, value) -> bool:
        """Whether this call runs in the decomposed steps: self-attention (the same tensor as
        query, key and value) with one packed projection and nothing added to the keys."""
        return (query is key and key is value and isinstance(query, torch.Tensor) and query.dim() in (2, 3)
                and not query.is_nested and self.in_proj_weight is not None and self.bias_k is None
                and not self.add_zero_attn)

    def _mask(self, key_padding_mask, attn_mask, need_weights, is_causal, b, n, dtype):
        """The additive mask (B or 1, heads or 1, N, N) torch's functional form would use, and
        whether ``scaled_dot_product_attention`` is asked for a causal one instead."""
        key_padding_mask = F._canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                                             other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
                                             target_type=dtype)
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer "
                               "module method `generate_square_subsequent_mask` to create this mask.")
        if is_causal and key_padding_mask is None and not need_weights:
            return None, True
        attn_mask = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                                      target_type=dtype, check_other=False)
        if attn_mask is not None:
            attn_mask = attn_mask.view(1, 1, n, n) if attn_mask.dim() == 2 else attn_mask.view(b, -1, n, n)
        if key_padding_mask is not None:
            padding = key_padding_mask.view(b, 1, 1, n)
            attn_mask = padding if attn_mask is None else attn_mask + padding
        return attn_mask, False


def _fits_torch(m: nn.MultiheadAttention) -> bool:
    """Whether ``m``'s tensors have the widths torch's own forward needs."""
    e, w = m.embed_dim, m.in_proj_weight
    return (m._qkv_same_embed_dim and m.num_heads * m.head_dim == e
            and (w is None or tuple(w.shape) == (3 * e, e)) and tuple(m.out_proj.weight.shape) == (e, e))


@contextlib.contextmanager
def decomposed(model: nn.Module):
    """``model`` with each of its ``nn.MultiheadAttention`` run as ``MultiheadAttention``
    (the same module, its class changed for the block)."""
    swapped = [m for m in model.modules() if type(m) is nn.MultiheadAttention]
    try:
        for m in swapped:
            m.__class__ = MultiheadAttention
        yield model
    finally:
        for m in swapped:
            m.__class__ = nn.MultiheadAttention


def thinned(model: nn.Module) -> list[str]:
    """Each ``nn.MultiheadAttention`` of ``model`` whose tensors a cut (or a loaded file) made
    narrower than torch's own forward takes becomes a ``MultiheadAttention``, its
    ``head_dim``, ``embed_dim``, ``kdim`` and ``vdim`` those of its tensors. Returns their names."""
    names = []
    for name, m in model.named_modules():
        if isinstance(m, nn.MultiheadAttention) and m.in_proj_weight is not None:
            rows, cols = m.in_proj_weight.shape
            m.head_dim = rows // 3 // max(m.num_heads, 1)
            if type(m) is nn.MultiheadAttention and _fits_torch(m):
                continue
            m.embed_dim = m.kdim = m.vdim = cols
            # what keeps torch's fused forms away (TransformerEncoderLayer's fast path takes the
            # widths from embed_dim alone): no other code reads it where in_proj_weight is set
            m._qkv_same_embed_dim = False
            m.__class__ = MultiheadAttention
            names.append(name)
    return names
