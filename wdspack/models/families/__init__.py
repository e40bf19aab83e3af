"""One module per model family, each ending in ``FAMILIES``: the :class:`~wdspack.models.family.Family`
records it declares. :func:`wdspack.models.known_families` lists this folder; adding a family is adding a module.
"""
