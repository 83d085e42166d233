"""DALI helpers shared by the operator tests (import only where DALI is installed)."""
import numpy as np
from nvidia.dali import fn, pipeline_def


def _constant(b):
    return lambda: b  # no parameters: DALI would pass the iteration index to one


def run_pipeline(graph, batch, num_threads=2):
    """Runs graph(*inputs) once on a CPU pipeline: `batch` is a list of per-input lists of arrays;
    returns one list of numpy arrays per output."""

    @pipeline_def(batch_size=len(batch[0]), num_threads=num_threads, device_id=None, exec_dynamic=True)
    def pipe():
        inputs = [fn.external_source(source=_constant(b), batch=True) for b in batch]
        out = graph(*inputs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    p = pipe()
    p.build()
    outs = p.run()
    return [[np.array(o[i]) for i in range(len(batch[0]))] for o in outs]
