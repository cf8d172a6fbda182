"""Compatibility shim for cli.py: the policy moved to gpucloud/providers/aws/policy.py (remove once
cli.py imports it from there)."""

from gpucloud.providers.aws.policy import policy_document

__all__ = ["policy_document"]
