"""The providers: one package per provider (the contract and the registry are in gpucloud/contract/)."""
