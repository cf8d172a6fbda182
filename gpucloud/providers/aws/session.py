"""boto3 sessions and clients shared by the process, and the ONE retrying call every AWS module
uses (docs/PROVIDERS.md, "AWS calls and retries").

Two layers of retry, both bounded: botocore's "standard" mode (2 tries per call, short connect
timeout) under gpucloud's own loop, which retries throttling and AWS-side failures with the same
arguments (so the same ClientToken) and full-jitter exponential backoff. A dead or unreachable
endpoint fails in well under 20 s: connection errors get CONNECT_ATTEMPTS tries, not RETRY_ATTEMPTS,
and a server that accepts but never answers costs BOTOCORE_ATTEMPTS x READ_TIMEOUT_S.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from gpucloud.providers.aws.access import classify_access
from gpucloud.providers.aws.errors import is_transient

CONNECT_TIMEOUT_S = 3.0  # TCP connect to an AWS endpoint: fail fast when it is unreachable
READ_TIMEOUT_S = 8.0  # one response; EC2/S3 answer in about a second, not minutes
BOTOCORE_ATTEMPTS = 2  # botocore's own tries per call, the first included ("standard" retry mode)
CONNECT_ATTEMPTS = 2  # gpucloud's tries of a call that could not connect at all
# STS GetCallerIdentity (the channel's account) is the first call of every run and answers in
# milliseconds: an endpoint that accepts connections but never answers is found out by it sooner.
PROBE_SERVICES = {"sts": 4.0}  # service -> read timeout (s)
# Every S3 client: the bucket's regional virtual-hosted name, `<bucket>.s3.<region>.amazonaws.com`
# (us-east-1 included), in requests and presigned URLs alike. botocore's default presigns the legacy
# global name, which answers 307 for hours after a bucket is made outside us-east-1 and 400 in every
# region launched after 2019-03-20 (docs/PROVIDERS.md, "S3 endpoints"). Dual-stack and FIPS stay
# the user's choice (AWS_USE_DUALSTACK_ENDPOINT / AWS_USE_FIPS_ENDPOINT, or the config file: botocore
# reads them itself); an endpoint URL (AWS_ENDPOINT_URL_S3, a local store) keeps path style on it.
S3_ADDRESSING = {"addressing_style": "virtual", "us_east_1_regional_endpoint": "regional"}

_SHARED_LOCK = threading.RLock()
_SESSION: Any = None
_SESSION_ENV = 0  # hash of the AWS_* variables _SESSION was made under
_CLIENTS: dict[
    tuple[int, str, str, str], tuple[Any, Any]
] = {}  # (id(session), service, region, sig) -> (session, client)
_CHANNELS: dict[tuple[int, str], Any] = {}  # (id(session), region) -> S3Channel


def client_config(service: str = "", **extra: Any) -> Any:
    """The botocore Config of every gpucloud client: standard retries and short timeouts (shorter
    still for the identity probe, PROBE_SERVICES); S3 clients address the bucket's region."""
    from botocore.config import Config

    if service == "s3":
        extra.setdefault("s3", dict(S3_ADDRESSING))
    return Config(
        retries={"mode": "standard", "total_max_attempts": BOTOCORE_ATTEMPTS},
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=PROBE_SERVICES.get(service, READ_TIMEOUT_S),
        user_agent_extra="gpucloud",
        **extra,
    )


def shared_session() -> Any:
    """This process's default boto3 Session (standard credential chain, AWS_ENDPOINT_URL honoured).

    A session and its clients keep what the AWS_* variables said when they were made (credentials,
    endpoint URLs, region), so when those variables change within the process (a library caller, an
    in-process test) the session and every client are made again rather than kept pointing at an
    endpoint or keys the environment no longer names."""
    global _SESSION, _SESSION_ENV
    env = hash(tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))))
    with _SHARED_LOCK:
        if _SESSION is None or env != _SESSION_ENV:
            import boto3

            _CHANNELS.clear()
            _CLIENTS.clear()
            _SESSION, _SESSION_ENV = boto3.Session(), env
        return _SESSION


def shared_client(session: Any, service: str, region: str, *, signature: str = "") -> Any:
    """One client per session, service and region: clients are thread-safe, creating them is not,
    and each new one loads its service model again (~0.1 s of JSON).

    A client holds the credentials its session had when it was made, so one made while there were
    none (before `aws sso login`, or with the variables not yet set) could never sign a request:
    it is returned but not kept, and the next call makes one that finds the credentials."""
    key = (id(session), service, region, signature)
    with _SHARED_LOCK:
        hit = _CLIENTS.get(key)
        if hit is not None and hit[0] is session:
            return hit[1]
        cfg = client_config(service, signature_version=signature) if signature else client_config(service)
        client = session.client(service, region_name=region, config=cfg)
        if session.get_credentials() is not None:  # resolved once per session by botocore, then cached
            _CLIENTS[key] = (session, client)  # the session is kept alive, so its id is never reused
        return client


def shared_channel(session: Any, region: str, make: Callable[[], Any]) -> Any:
    """The region's channel for this session, made once (its bucket is checked once per process)."""
    key = (id(session), region)
    with _SHARED_LOCK:
        chan = _CHANNELS.get(key)
        if chan is None or chan.session is not session:
            chan = _CHANNELS[key] = make()
        return chan


def reset_shared(*, channels_only: bool = False) -> None:
    """Forget the shared channels (their bucket check), and unless channels_only the session and
    clients too (new credentials or endpoint)."""
    global _SESSION
    with _SHARED_LOCK:
        _CHANNELS.clear()
        if not channels_only:
            _SESSION = None
            _CLIENTS.clear()


def backoff(attempt: int, base_s: float, cap_s: float) -> float:
    """Exponential backoff with full jitter (the AWS Architecture Blog's recommendation)."""
    ceiling = min(cap_s, base_s * (2**attempt))
    return random.uniform(ceiling / 2, ceiling)


def retrying_call(
    client: Any,
    op: str,
    *,
    attempts: int,
    base_s: float,
    cap_s: float,
    sleep: Callable[[float], None] = time.sleep,
    **kwargs: Any,
) -> Any:
    """One API call; throttling and AWS-side failures are retried with the same arguments up to
    `attempts` times, other connection failures (a dropped connection) up to CONNECT_ATTEMPTS; then
    the last error is raised with `gpucloud_tries` set on it (the error message says how hard we
    tried). Missing or refused credentials and an endpoint that does not answer (botocore already
    retried it) are raised at once as CredentialsError / EndpointError (access.py)."""
    from botocore.exceptions import BotoCoreError, ClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    tries = 0
    while True:
        tries += 1
        try:
            return getattr(client, op)(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            access = classify_access(exc, what=op)  # refused credentials, dead endpoint: no retry
            if access is not None:
                raise access from None
            if isinstance(exc, ClientError):
                if not is_transient(exc) or tries >= attempts:
                    exc.gpucloud_tries = tries
                    raise
            elif not isinstance(exc, BotoConnectionError) or tries >= min(attempts, CONNECT_ATTEMPTS):
                exc.gpucloud_tries = tries
                raise
        sleep(backoff(tries - 1, base_s, cap_s))


class AwsClients:
    """A session, its clients and the retrying call, with the waits as class attributes (a test
    shortens them for a fake cloud that answers in milliseconds). Every AWS module works through
    one of these; AwsProvider is one."""

    RETRY_ATTEMPTS = 6  # tries of one call under throttling / AWS-side errors
    RETRY_BASE_S = 0.5  # first backoff; doubles, with full jitter
    RETRY_CAP_S = 10.0  # longest single backoff
    POLL_S = 5.0  # instance-state polling while waiting for termination
    TERMINATE_TIMEOUT_S = 600.0
    SG_DELETE_TIMEOUT_S = 300.0  # DependencyViolation persists until the ENIs are gone
    PG_DELETE_TIMEOUT_S = 300.0  # InvalidPlacementGroup.InUse persists until the instances are gone

    def __init__(
        self,
        *,
        session: Any = None,
        sleep: Callable[[float], None] | None = None,
        retry_attempts: int | None = None,
        retry_base_s: float | None = None,
        poll_s: float | None = None,
    ) -> None:
        self._session = session
        self.sleep = sleep or time.sleep
        self.retry_attempts = retry_attempts if retry_attempts is not None else self.RETRY_ATTEMPTS
        self.retry_base_s = retry_base_s if retry_base_s is not None else self.RETRY_BASE_S
        self.poll_s = poll_s if poll_s is not None else self.POLL_S

    @property
    def session(self) -> Any:
        """The injected session, else the one boto3 Session this process shares."""
        if self._session is None:
            self._session = shared_session()
        return self._session

    def client(self, service: str, region: str) -> Any:
        return shared_client(self.session, service, region)

    def backoff(self, attempt: int) -> float:
        return backoff(attempt, self.retry_base_s, self.RETRY_CAP_S)

    def call(self, client: Any, op: str, **kwargs: Any) -> Any:
        """`retrying_call` with this object's limits."""
        return retrying_call(
            client,
            op,
            attempts=self.retry_attempts,
            base_s=self.retry_base_s,
            cap_s=self.RETRY_CAP_S,
            sleep=self.sleep,
            **kwargs,
        )

    def ec2(self, op: str, region: str, **kwargs: Any) -> Any:
        """An EC2 call in `region` through the retrying call."""
        return self.call(self.client("ec2", region), op, **kwargs)
