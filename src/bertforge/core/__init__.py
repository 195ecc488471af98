"""The base every layer may use: atomic file writes (``io``), the valid ranges of settings
(``limits``) and stop signals (``signals``). Nothing here imports another bertforge package
except ``bertforge.errors``."""
