"""What crosses between the core and a provider: the contract, the capability services, the registry."""
