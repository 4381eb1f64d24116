"""`deep_ep` on fusco: DeepEP's Python API, re-exported from fusco.deep_ep (the fusco PyTorch
plugin). Installed on request only (scripts/install-deep-ep-alias), into an environment without a
real DeepEP."""
from fusco.deep_ep import Buffer, Config, EventHandle, EventOverlap, topk_idx_t

from . import utils
from ._fusco_alias import FUSCO_ALIAS

__all__ = ["Buffer", "Config", "EventHandle", "EventOverlap", "topk_idx_t", "utils",
           "FUSCO_ALIAS"]
