"""AWS: EC2 machines and an S3 channel (docs/INTERNALS.md, "Providers"; facts in docs/PROVIDERS.md).

Module map (each imports only the ones above it; none imports boto3 at import time):
- errors      error codes -> ProvisionError kinds, quota codes, AwsTeardownError
- access      credential / endpoint errors -> CredentialsError / EndpointError (skip the cloud)
- session     shared session/clients (bounded timeouts) and the one retrying call (AwsClients)
- credentials warning when temporary credentials end before the run's deadline
- images      Ubuntu AMI via SSM (fallback DescribeImages), default VPC and zones
- network     security group and rules, placement group, SSH key pair; tags
- efa         EFA interfaces per network card (DescribeInstanceTypes), an Elastic IP per EFA node
- launch      RunInstances for all nodes of an attempt, zone by zone
- deadline    the EventBridge Scheduler schedule that terminates an attempt after its expiry (layer c)
- reaper      the one deletion order (teardown, failed-attempt cleanup, gc)
- teardown    RunHandle/journal/tags -> what to delete; gc by expiry tag
- channel     S3Channel (presigned URLs, one bucket per account and region)
- policy      the IAM policy document and the deadline role (`gpucloud iam-policy aws`), pure data
- provider    AwsProvider, composing the above
"""

from gpucloud.providers.aws.errors import AwsTeardownError, classify, quota_for
from gpucloud.providers.aws.launch import client_token
from gpucloud.providers.aws.provider import AwsProvider, fit_user_data
from gpucloud.providers.aws.session import reset_shared

__all__ = ["AwsProvider", "AwsTeardownError", "classify", "client_token", "fit_user_data", "quota_for", "reset_shared"]
