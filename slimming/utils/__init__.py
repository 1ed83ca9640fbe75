"""File and device utilities every part may use: atomic writes, checksummed files, the run
lock and signal handling (``files``), bounded, checksummed ``torch.load`` and ``torch.save``
(``safeload``), choosing and announcing the device (``devices``), and the network inside a
DataParallel / DDP / torch.compile wrapper (``modules``), progress bars and ``--quiet``
(``progress``).

Which parts it may import: ``docs/layout.md``.
"""
