"""numpy oracles shared by the tests."""
import numpy as np

NP_MODE = {"constant": "constant", "periodic": "wrap", "reflect": "reflect", "symmetric": "symmetric", "edge": "edge"}


def np_pad_window(domain_array, region):
    """The oracle: np.pad the domain, one axis at a time with that axis's numpy mode, then slice."""
    padded = domain_array
    pads = region.pads
    for a, mode in enumerate(region.boundary):
        if mode == "trim":
            assert pads[a] == (0, 0)
            continue
        width = [(0, 0)] * padded.ndim
        width[a] = pads[a]
        kwargs = {"constant_values": region.fill_value} if mode == "constant" else {}
        padded = np.pad(padded, width, mode=NP_MODE[mode], **kwargs)
    index = []
    for a in range(region.ndim):
        lo = region.window_start[a] - region.domain_start[a] + pads[a][0]
        index.append(slice(lo, lo + region.window_shape[a]))
    return padded[tuple(index)]


def np_pad_sample(sample, region):
    """The window of a whole sample by np.pad of its domain (the crop box)."""
    domain = sample[tuple(slice(a, b) for a, b in zip(region.domain_start, region.domain_stop))]
    return np_pad_window(domain, region)
