"""The mark of fusco's alias package: scripts/install-deep-ep-alias replaces a `deep_ep` only
where this file is beside its __init__.py (never a real DeepEP)."""
FUSCO_ALIAS = True
