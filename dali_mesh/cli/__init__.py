"""``dali-mesh``: the command line (:mod:`.main`: ``plan``, ``demo``, ``convert``) and its tools: the
argument parsers (:mod:`.options`), layout advice (:mod:`.advice`), ``convert`` (:mod:`.convert`), the
demo (:mod:`.demo`) and the local launcher (:mod:`.launch`). ``python -m dali_mesh.cli`` runs it."""
from dali_mesh.cli.main import (MAX_ROWS, UsageError, main, parse_boundary, parse_halo, parse_ints, parse_pairs,
                                parse_shard)

__all__ = ["main", "MAX_ROWS", "UsageError", "parse_boundary", "parse_halo", "parse_ints", "parse_pairs",
           "parse_shard"]
