"""Each rank decodes only its tile of every image: the tile equals the same tile of a full decode,
halo at the image edges included, for several image sizes (odd ones too) in one batch."""
import io
import logging

import numpy as np
import pytest

pytest.importorskip("nvidia.dali")
PIL = pytest.importorskip("PIL.Image")

from dali_mesh import Layout, MeshInfo  # noqa: E402
from dali_mesh.partition import LayoutError, take_window  # noqa: E402

SIZES = [(37, 53), (64, 48), (17, 91), (8, 8)]


def _jpegs(tmp_path, subsampling):
    seed = np.random.SeedSequence().entropy % 2**32
    logging.getLogger(__name__).info("image seed %d", seed)
    rng = np.random.default_rng(seed)
    files = []
    for i, (h, w) in enumerate(SIZES):
        y, x = np.mgrid[0:h, 0:w]
        img = np.stack([(x * 255 // w), (y * 255 // h), (x + y) % 256], axis=-1).astype(np.float64)
        img += rng.normal(0, 20, img.shape)
        buf = io.BytesIO()
        PIL.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90,
                                                                   subsampling=subsampling)
        f = tmp_path / f"img{i}.jpg"
        f.write_bytes(buf.getvalue())
        files.append(str(f))
    return files


def _run(files, layouts):
    from nvidia.dali import fn, pipeline_def

    from dali_mesh.pipeline.image_tiles import decode_tile

    @pipeline_def(batch_size=len(files), num_threads=1, device_id=None)
    def pipe():
        jpegs, _ = fn.readers.file(files=files)
        return (fn.decoders.image(jpegs, device="cpu"),) + tuple(decode_tile(jpegs, lay) for lay in layouts)

    p = pipe()
    p.build()
    outs = p.run()
    return [[np.array(o[i]) for i in range(len(files))] for o in outs]


@pytest.mark.parametrize("subsampling", [0, 2])  # 4:4:4 and 4:2:0
@pytest.mark.parametrize("boundary", ["constant", "edge", "reflect", "symmetric", "trim"])
def test_tiles_equal_tiles_of_a_full_decode(tmp_path, boundary, subsampling):
    files = _jpegs(tmp_path, subsampling)
    mesh = MeshInfo((2, 3), ("h", "w"))
    layouts = [Layout(mesh.with_coordinate(c), shard={"h": 0, "w": 1}, halo={0: 3, 1: (2, 11)},
                      boundary={0: boundary, 1: boundary}, fill_value=7) for c in mesh.coordinates()]
    full, *tiles = _run(files, layouts)
    for layout, per_image in zip(layouts, tiles):
        for img, tile, path in zip(full, per_image, files):
            region = layout.region(img.shape)
            expected = take_window(img, region)
            assert tile.shape == expected.shape, (path, layout.mesh.coordinate)
            np.testing.assert_array_equal(tile, expected, err_msg=f"{path} at {layout.mesh.coordinate}")


def test_halo_bigger_than_the_tile(tmp_path):
    files = _jpegs(tmp_path, 0)
    mesh = MeshInfo((4,), ("h",))
    layouts = [Layout(mesh.with_coordinate(c), shard={"h": 0}, halo={0: 9, 1: 4},
                      boundary={0: "reflect", 1: "symmetric"}) for c in mesh.coordinates()]
    full, *tiles = _run(files, layouts)
    for layout, per_image in zip(layouts, tiles):
        for img, tile in zip(full, per_image):
            np.testing.assert_array_equal(tile, take_window(img, layout.region(img.shape)))


def test_unsupported_image_layouts():
    from nvidia.dali import fn, pipeline_def

    from dali_mesh.pipeline.image_tiles import decode_tile

    mesh = MeshInfo((2,), ("h",))
    for kwargs, match in [({"boundary": {0: "periodic"}}, "boundary 'periodic' on image axis 0"),
                          ({"shard": {"h": 2}}, "channel axis 2 cannot be sharded"),
                          ({"halo": {2: 1}}, "no halo on the channel axis")]:
        layout = Layout(mesh, **{"shard": {"h": 0}, **kwargs})

        @pipeline_def(batch_size=1, num_threads=1, device_id=None)
        def pipe():
            jpegs, _ = fn.readers.file(files=["unused.jpg"])
            return decode_tile(jpegs, layout)

        with pytest.raises(LayoutError, match=match):
            pipe()
