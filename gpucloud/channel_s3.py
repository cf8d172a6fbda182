"""Compatibility shim: the S3 channel moved to gpucloud/providers/aws/channel.py (remove once
nothing imports this path)."""

from gpucloud.providers.aws.channel import S3Channel, S3ChannelError, bucket_name

__all__ = ["S3Channel", "S3ChannelError", "bucket_name"]
