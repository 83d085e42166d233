"""CF time coordinates (``units: "hours since 1959-01-01"``, ``calendar``) decoded to numpy
``datetime64[ns]``, as xarray decodes them."""
from __future__ import annotations

import re

import numpy as np

__all__ = ["CALENDARS", "decode_cf_time"]

#: calendars numpy's proleptic Gregorian datetime64 represents (``standard``/``gregorian`` from
#: 1582-10-15 on, where they are the proleptic Gregorian calendar)
CALENDARS = ("standard", "gregorian", "proleptic_gregorian")
_GREGORIAN_START_S = int(np.datetime64("1582-10-15", "s").astype(np.int64))  # seconds since 1970
_UNITS_NS = {"nanoseconds": 1, "microseconds": 10 ** 3, "milliseconds": 10 ** 6, "seconds": 10 ** 9,
             "minutes": 60 * 10 ** 9, "hours": 3600 * 10 ** 9, "days": 86400 * 10 ** 9}
_UNIT_NAMES = {"ns": "nanoseconds", "us": "microseconds", "ms": "milliseconds", "s": "seconds", "sec": "seconds",
               "secs": "seconds", "second": "seconds", "min": "minutes", "mins": "minutes", "minute": "minutes",
               "h": "hours", "hr": "hours", "hrs": "hours", "hour": "hours", "d": "days", "day": "days",
               "nanosecond": "nanoseconds", "microsecond": "microseconds", "millisecond": "milliseconds"}
_DATE = re.compile(r"^\s*(-?\d{1,4})-(\d{1,2})-(\d{1,2})(?:[ T](\d{1,2}):(\d{1,2})(?::(\d{1,2})(\.\d+)?)?)?"
                   r"\s*(Z|UTC|GMT|[+-]0{1,2}(?::?00)?)?\s*$")


def _parse_reference(text: str, where: str) -> int:
    """The reference date as nanoseconds since 1970-01-01 (a Python int: any year 1..9999)."""
    m = _DATE.match(text)
    if m is None:
        raise ValueError(f"{where}: cannot read the reference date {text!r} (expected 'YYYY-MM-DD[ hh:mm[:ss]]', UTC)")
    y, mo, d, hh, mm, ss, frac, _tz = m.groups()
    iso = f"{int(y):04d}-{int(mo):02d}-{int(d):02d}T{int(hh or 0):02d}:{int(mm or 0):02d}:{int(ss or 0):02d}"
    try:
        seconds = int(np.datetime64(iso, "s").astype(np.int64))
    except ValueError:
        raise ValueError(f"{where}: the reference date {text!r} is not a date") from None
    return seconds * 10 ** 9 + (int(round(float(frac) * 1e9)) if frac else 0)


def decode_cf_time(values: np.ndarray, attrs: dict, where: str) -> np.ndarray:
    """CF time ``values`` (``units: "<unit> since <date>"``, ``calendar``) as ``datetime64[ns]``.

    Calendars ``standard``/``gregorian`` (from 1582-10-15) and ``proleptic_gregorian``; others
    (``noleap``, ``360_day``, ``julian``, ...) are refused naming the calendar. Values already
    ``datetime64`` are returned as nanoseconds."""
    values = np.asarray(values)
    if np.issubdtype(values.dtype, np.datetime64):
        return values.astype("datetime64[ns]")
    units = attrs.get("units")
    if not isinstance(units, str) or " since " not in units:
        raise ValueError(f"{where}: time coordinate has units {units!r}, not '<unit> since <date>' (CF)")
    calendar = str(attrs.get("calendar", "standard")).lower()
    if calendar not in CALENDARS:
        raise ValueError(f"{where}: calendar {calendar!r} is not supported (numpy datetime64 is the proleptic "
                         f"Gregorian calendar: {', '.join(CALENDARS)})")
    unit, ref = units.split(" since ", 1)
    unit = unit.strip().lower()
    unit = _UNIT_NAMES.get(unit, unit)
    if unit not in _UNITS_NS:
        raise ValueError(f"{where}: time unit {unit!r} is not one of {', '.join(_UNITS_NS)}")
    reference = _parse_reference(ref, where)
    if not (np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating)):
        raise ValueError(f"{where}: time values of dtype {values.dtype} are not numbers")
    scale = _UNITS_NS[unit]
    if np.issubdtype(values.dtype, np.floating):
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{where}: time coordinate holds NaN or infinite values")
        scaled = np.round(values.astype(np.float64) * scale)
        lo, hi = (float(scaled.min()), float(scaled.max())) if scaled.size else (0.0, 0.0)
    else:
        lo, hi = (int(values.min()) * scale, int(values.max()) * scale) if values.size else (0, 0)
    first, last = reference + lo, reference + hi  # exact in Python ints (floats: to the ns)
    if calendar in ("standard", "gregorian") and first < _GREGORIAN_START_S * 10 ** 9:
        raise ValueError(f"{where}: times before 1582-10-15 in the {calendar!r} calendar are Julian dates, "
                         "which numpy datetime64 does not represent")
    if first < -(2 ** 63) + 1 or last > 2 ** 63 - 1 or max(abs(lo), abs(hi)) > 2 ** 63 - 1:
        raise ValueError(f"{where}: time values overflow datetime64[ns] (1677-09-21 .. 2262-04-11; {units})")
    delta = scaled.astype(np.int64) if np.issubdtype(values.dtype, np.floating) else values.astype(np.int64) * scale
    out = (np.int64(reference) + delta).astype("datetime64[ns]")
    return out
