"""File and device utilities every part may use: atomic writes, checksummed files, the run
lock and signal handling (``files``), choosing and announcing the device (``devices``), and the
network inside a DataParallel / DDP / torch.compile wrapper (``modules``).

Imports: ``slimming.errors`` only.
"""
