"""Events of the DeepEP-compatible module (DeepEP's `deep_ep.utils`): EventHandle and
EventOverlap, which Megatron-LM imports from here.

On CUDA an EventHandle records a CUDA event on torch's current stream when it is made, and
`current_stream_wait()` makes the current stream wait for it. Without CUDA (CPU tensors, host
communicators) every call of the module is complete when it returns, so an EventHandle holds no
event and waiting for it returns at once.
"""
import torch


def _cuda_in_use():
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class EventHandle:
    """A point in torch's current CUDA stream, recorded at construction (nothing on the host)."""

    def __init__(self):
        self.event = None
        if _cuda_in_use():
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream())

    def current_stream_wait(self):
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)


class EventOverlap:
    """What DeepEP's calls return with `async_finish`: `.event` (an EventHandle, or None when the
    call finished before it returned), `current_stream_wait()`, and a context manager that waits
    on exit. `extra_tensors` are kept alive until the object is dropped."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self):
        if self.event is None:
            raise RuntimeError("deep_ep: EventOverlap.current_stream_wait() on an overlap "
                               "without an event (the call was made without async_finish)")
        self.event.current_stream_wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.event is not None:
            self.event.current_stream_wait()
        return False


__all__ = ["EventHandle", "EventOverlap"]
