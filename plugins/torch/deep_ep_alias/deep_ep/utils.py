"""`deep_ep.utils` on fusco: EventHandle and EventOverlap (Megatron-LM imports both from here)."""
from fusco.deep_ep.utils import EventHandle, EventOverlap

__all__ = ["EventHandle", "EventOverlap"]
