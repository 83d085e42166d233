"""The DALI side: the plugin loader (:mod:`.plugin`), the plugin's operators (:mod:`.ops`), a source
as a parallel external source (:mod:`.external`), the native reader (:mod:`.native`), the watchdog
(:mod:`.watchdog`) and image tiles (:mod:`.image`). :mod:`dali_mesh.fn` is the public face.

Importing this package imports nothing of DALI; :mod:`.watchdog` and :mod:`.external` import DALI
only when called, the other modules when imported.
"""
