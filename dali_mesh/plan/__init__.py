"""Plans: from a window to the byte ranges, decodes, copies and fills that read it (Python's side of
``csrc/plan/`` and ``csrc/reader/``).

- :mod:`.window`    a ``Region`` as boxes to read and a boundary program (:class:`WindowPlan`)
- :mod:`.ranges`    the generic byte-range planner: boxes of an array lying in a file as merged units
- :mod:`.chunks`    boxes of a chunked array as pieces of chunks; a time series' plan
- :mod:`.types`     the native reader's objects (:class:`ReadPlan`, :class:`PlanFile`, :class:`Coder` ...)
- :mod:`.encoding`  their field tables (one definition encodes and decodes)
- :mod:`.plan_set`  :class:`PlanSet` and its algebra; :mod:`.files` where plan files are kept
- :mod:`.forecast_spec`  :class:`ForecastSpec`, the steps of a forecast sample (what a time series' plan reads)
"""
from dali_mesh.plan.files import PlanFolderError, read_file_at
from dali_mesh.plan.forecast_spec import ForecastSpec
from dali_mesh.plan.plan_set import PlanSet, stack_channels
from dali_mesh.plan.types import (CHECK_JSON, CODEC_LIBRARIES, CODECS, PLAN_MAGIC, AxisProgram, Coder,
                                  NotNativeError, PlanFile, PlanItem, PlanPart, ReadPlan, native_dtype_of,
                                  native_store)
from dali_mesh.plan.window import AxisPlan, WindowPlan, plan_window

__all__ = ["AxisPlan", "AxisProgram", "CHECK_JSON", "CODECS", "CODEC_LIBRARIES", "Coder", "ForecastSpec", "NotNativeError",
           "PLAN_MAGIC", "PlanFile", "PlanFolderError", "PlanItem", "PlanPart", "PlanSet", "ReadPlan", "WindowPlan",
           "native_dtype_of", "native_store", "plan_window", "read_file_at", "stack_channels"]
