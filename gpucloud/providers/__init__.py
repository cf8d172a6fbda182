"""The providers: the registry, the contract (base.py) and one package per provider."""
