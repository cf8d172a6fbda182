"""Which `ImageStore` (gpucloud/images_build.py) serves which cloud: the one place that maps names.

Azure (managed image / gallery version) is not written yet: asking for it is a clear UserError.
"""

from __future__ import annotations

from gpucloud.errors import UserError
from gpucloud.images_build import ImageStore


def image_store(cloud: str) -> ImageStore:
    if cloud == "aws":
        from gpucloud.providers.images_aws import AwsImageStore

        return AwsImageStore()
    raise UserError(f"Baked images are not supported on {cloud!r} yet.", hint="Use --cloud aws.")
