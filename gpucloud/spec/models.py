"""The job file's pydantic v2 models (JobSpec and friends). The attributes are a contract used by
the planner, render and the lifecycle; the validators accept the friendly input forms ("K80:1",
"6h", "any", "pytorch==2.0.1") and turn them into canonical values. `image_kind` is the one check
of an `image:` string. Cloud names come from the provider registry."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from gpucloud.contract import registry as providers
from gpucloud.spec.container import ContainerSpec
from gpucloud.spec.data import DataPath, InputSource, OutputDest
from gpucloud.spec.gpu import GpuRequest, gpu_input, gpu_list_input
from gpucloud.spec.recovery import DEFAULT_CHECKPOINT_INTERVAL_S, Recovery, checkpoint_interval, checkpoint_path
from gpucloud.spec.values import (
    AMI_RE,
    CLOUD_INPUT,
    CLOUD_WORDS,
    DURATION_PATTERN,
    FRAMEWORK_ALIASES,
    FRAMEWORKS,
    GPU_SHORTHAND_PATTERN,
    HOST_RE,
    IMAGE_PATTERN,
    INSTANCE_RE,
    MAX_DURATION_S,
    MIN_DURATION_S,
    NAME_RE,
    PKG_VERSION_RE,
    REGION_RE,
    VERSION_RE,
    ArtifactPath,
    CloudName,
    CpuArch,
    EnvKey,
    EnvValue,
    FrameworkName,
    KeepSeconds,
    PortList,
    cpu_arch,
    describe,
    did_you_mean,
    format_duration,
    parse_duration,
    refuse_bool,
    reject,
    required_text,
)

# ---------------------------------------------------------------------------------------------
# Models

_SLURM_NAME = r"[A-Za-z0-9_.-]+"
_SCHEDULER_FIELDS = {  # field -> (pattern, what is expected)
    "cluster": (HOST_RE.pattern, "local, an ssh alias or [user@]host[:port] of the cluster's login node"),
    "partition": (rf"{_SLURM_NAME}(,{_SLURM_NAME})*", "a partition name (or several, comma-separated)"),
    "account": (_SLURM_NAME, "an account name"),
    "qos": (_SLURM_NAME, "a QOS name"),
    "constraint": (r"[A-Za-z0-9_.&|,*:!\[\]()-]+", "a feature expression such as k80&ib (no spaces)"),
}


def _auto_or_version(value: Any, pattern: re.Pattern[str], example: str, wrong: str) -> str:
    """ "auto" or a version matching `pattern`; numbers from YAML are taken as text. `wrong` is the
    message ({value} as written, {text} as read) when it does not match."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    text = required_text(value, f"auto or {example}")
    if text.lower() == "auto":
        return "auto"
    if not pattern.fullmatch(text):
        reject(wrong.format(value=value, text=text))
    return text


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


def image_kind(image: str) -> Literal["auto", "ami", "urn"] | None:
    """The one check of an `image:` string: "auto", an AMI id, a 4-part image URN, or None when it
    is none of them. Providers call this rather than re-parse the string."""
    if image.lower() == "auto":
        return "auto"
    if AMI_RE.fullmatch(image):
        return "ami"
    parts = image.split(":")
    if len(parts) == 4 and all(p and not re.search(r"\s", p) for p in parts):
        return "urn"
    return None


class Resources(_Strict):
    cloud: list[CloudName] = Field(default_factory=lambda: list(providers.any_clouds()))  # "any": the registry's
    regions: list[str] | None = None
    gpu: GpuRequest | None = None  # the first of gpu_options when the job lists alternatives
    gpu_options: list[GpuRequest] = Field(default_factory=list)  # `gpu: [L4:1, A10G:1]`: any of these
    gpu_order: Literal["cheapest", "ordered"] = "cheapest"  # ordered: the list's order before price
    instance_type: str | None = None
    spot: bool | Literal["auto"] = False
    arch: CpuArch = "x86_64"  # the host CPU: x86_64 | arm64 | any (the catalog's `arch` column)
    max_price_per_hour: float | None = Field(default=None, gt=0)
    min_vcpus: int | None = Field(default=None, ge=1)
    min_memory_gib: float | None = Field(default=None, gt=0)
    disk_gb: int = Field(default=100, ge=20, le=16384)
    ssh: bool = False
    idle_timeout: int | None = None  # seconds every GPU may sit idle before the run is ended (off: None)
    hosts: list[str] | None = None  # machines you own (providers with takes_hosts): `[user@]host[:port]` or ssh aliases
    # A batch scheduler (providers with takes_cluster, docs/SLURM.md): its login node
    # (`[user@]host[:port]`, an ssh alias, or `local` on a submit host) and the job's placement there.
    cluster: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None

    @field_validator("cluster", "partition", "account", "qos", "constraint", mode="before")
    @classmethod
    def _scheduler_field(cls, value: Any, info: ValidationInfo) -> str | None:
        """A login node or a scheduler name: one word (they go on the sbatch line and into a
        remote shell, quoted; a space or a quote is always a mistake there)."""
        if value is None:
            return None
        pattern, expected = _SCHEDULER_FIELDS[str(info.field_name)]
        text = required_text(value, expected).strip()
        if not re.fullmatch(pattern, text):
            reject(f"{describe(value)} is not valid. Expected {expected}")
        return text

    @field_validator("hosts", mode="before", json_schema_input_type=str | list[str] | None)
    @classmethod
    def _hosts(cls, value: Any) -> list[str] | None:
        """One host or a list; each `[user@]host[:port]` or a ~/.ssh/config alias (docs/SSH.md)."""
        expected = "a list of hosts such as [gpu-box, alice@10.0.0.7:2222]"
        if value is None:
            return None
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            reject(f"expected {expected}, got {describe(value)}")
        out: list[str] = []
        for i, item in enumerate(items):
            sub = () if isinstance(value, str) else (i,)
            text = item.strip() if isinstance(item, str) else ""
            port = text.rpartition(":")[2] if ":" in text and not text.endswith("]") else ""
            if not HOST_RE.fullmatch(text) or (port and not 1 <= int(port) <= 65535):
                reject(
                    f"{describe(item)} is not a host. Expected [user@]host[:port] or an alias from ~/.ssh/config", *sub
                )
            if text not in out:
                out.append(text)
        return out

    @model_validator(mode="after")
    def _hosts_go_with_their_cloud(self) -> Resources:
        """A provider that runs on named machines runs alone (your own machines are no fallback for
        paid ones), and `hosts` with any other cloud would be ignored silently."""
        takers = [c for c in self.cloud if providers.info(c).takes_hosts]
        if takers and len(self.cloud) > 1:
            reject(
                f"{takers[0]} cannot be combined with other clouds (your own machines are not a fallback "
                f"for paid ones). Use cloud: {takers[0]} alone",
                "cloud",
            )
        if self.hosts and not takers:
            names = " or ".join(providers.host_clouds())
            reject(f"is only used with cloud: {names}. Add cloud: {names}, or remove hosts", "hosts")
        return self._cluster_goes_with_its_cloud()

    def _cluster_goes_with_its_cloud(self) -> Resources:
        """A batch scheduler runs alone too, needs its login node, and its fields mean nothing elsewhere."""
        takers = [c for c in self.cloud if providers.info(c).takes_cluster]
        if takers and len(self.cloud) > 1:
            reject(f"{takers[0]} cannot be combined with other clouds. Use cloud: {takers[0]} alone", "cloud")
        if takers and not self.cluster:
            reject(
                f"cloud: {takers[0]} needs cluster: the login node (an ssh alias or [user@]host[:port]), "
                "or local when gpucloud runs on a submit host",
                "cloud",
            )
        names = " or ".join(providers.cluster_clouds())
        for name in _SCHEDULER_FIELDS:
            if getattr(self, name) and not takers:
                reject(f"is only used with cloud: {names}. Add cloud: {names}, or remove {name}", name)
        return self

    @field_validator("cloud", mode="before", json_schema_input_type=CLOUD_INPUT | list[CLOUD_INPUT])
    @classmethod
    def _cloud(cls, value: Any) -> list[str]:
        """ "any" -> the registry's any_clouds(); a single name or a list; case-insensitive,
        deduplicated in order."""
        expected = f"{', '.join(CLOUD_WORDS)}, or a list of them"
        if value is None:
            reject(f"has no value. Expected {expected}")
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            reject(f"expected {expected}, got {describe(value)}")
        if not items:
            reject(f"the list is empty. Expected {expected}")
        out: list[str] = []
        for i, item in enumerate(items):
            sub = () if isinstance(value, str) else (i,)
            if not isinstance(item, str):
                reject(f"expected a cloud name, got {describe(item)}. Expected {expected}", *sub)
            word = item.strip().lower()
            if word not in CLOUD_WORDS:
                close = did_you_mean(word, CLOUD_WORDS)
                hint = f"Did you mean '{close}'? " if close else ""
                reject(f"unknown cloud '{item}'. {hint}Expected {expected}", *sub)
            for name in providers.any_clouds() if word == "any" else (word,):
                if name not in out:
                    out.append(name)
        return out

    @field_validator("regions", mode="before", json_schema_input_type=str | list[str] | None)
    @classmethod
    def _regions(cls, value: Any) -> list[str] | None:
        """A single region or a list; lower-cased ("East US" style names are not region codes)."""
        if value is None:
            return None
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            reject(f"expected a region or a list of regions such as [us-east-1, eastus], got {describe(value)}")
        if not items:
            reject("the list is empty. Name at least one region, or remove the key to allow all")
        out: list[str] = []
        for i, item in enumerate(items):
            sub = () if isinstance(value, str) else (i,)
            if not isinstance(item, str) or not REGION_RE.fullmatch(item.strip().lower()):
                reject(
                    f"{describe(item)} is not a region code. Expected names such as us-east-1 (AWS) or eastus (Azure)",
                    *sub,
                )
            region = item.strip().lower()
            if region not in out:
                out.append(region)
        return out

    @field_validator(
        "gpu",
        mode="before",
        json_schema_input_type=Annotated[str, Field(pattern=GPU_SHORTHAND_PATTERN)]
        | GpuRequest
        | list[Annotated[str, Field(pattern=GPU_SHORTHAND_PATTERN)] | GpuRequest]
        | None,
    )
    @classmethod
    def _gpu(cls, value: Any) -> Any:
        """ "K80:1" / "k80" / "A100|H100:8" / "L4:1..2" -> {model, count, ...}; mappings go to
        GpuRequest as they are (a list was moved to gpu_options before this runs)."""
        return gpu_input(value)

    @model_validator(mode="before")
    @classmethod
    def _gpu_list(cls, data: Any) -> Any:
        return gpu_list_input(data)

    @model_validator(mode="after")
    def _first_option(self) -> Resources:
        """`gpu` is the first alternative, so code that needs one GPU (a stack, a host) still reads it."""
        if self.gpu_options:
            self.gpu = self.gpu_options[0]
        return self

    @property
    def gpu_requests(self) -> list[GpuRequest]:
        """Every GPU request the job accepts, in the order written (one, or the alternatives)."""
        return list(self.gpu_options) if self.gpu_options else ([self.gpu] if self.gpu else [])

    @field_validator(
        "idle_timeout",
        mode="before",
        json_schema_input_type=int | Annotated[str, Field(pattern=DURATION_PATTERN)] | None,
    )
    @classmethod
    def _idle_timeout(cls, value: Any) -> int | None:
        """ "10m" / 600 / "off": a hung job (GPUs idle that long) stops billing; off by default."""
        if value is None or value is False or (isinstance(value, str) and value.strip().lower() in ("off", "none")):
            return None
        seconds = parse_duration(value)
        if seconds < 1:
            reject(f"{describe(value)} is {seconds} s. Expected a duration such as 10m, or off")
        return seconds

    @field_validator("instance_type", mode="before")
    @classmethod
    def _instance_type(cls, value: Any) -> str | None:
        if value is None:
            return None
        text = required_text(value, "an instance type such as g4dn.xlarge or Standard_NC4as_T4_v3")
        if not INSTANCE_RE.fullmatch(text):
            reject(f"'{value}' is not an instance type name. Expected e.g. g4dn.xlarge or Standard_NC4as_T4_v3")
        return text

    @field_validator("spot", mode="before", json_schema_input_type=bool | Literal["auto"])
    @classmethod
    def _spot(cls, value: Any) -> bool | str:
        if isinstance(value, bool):
            return value
        word = value.strip().lower() if isinstance(value, str) else None
        if word == "auto":
            return "auto"
        if word in {"true", "yes", "on"}:
            return True
        if word in {"false", "no", "off"}:
            return False
        reject(
            f"{describe(value)} is not allowed. Expected true, false or auto "
            "(auto = spot when it is cheaper, falling back to on-demand)"
        )

    @field_validator("arch", mode="before", json_schema_input_type=CpuArch)
    @classmethod
    def _arch(cls, value: Any) -> str:
        return cpu_arch(value)

    @property
    def arches(self) -> frozenset[str] | None:
        """The catalog `arch` values the job accepts; None: every one."""
        return None if self.arch == "any" else frozenset((self.arch,))

    @field_validator("max_price_per_hour", "min_vcpus", "min_memory_gib", "disk_gb", mode="before")
    @classmethod
    def _numbers(cls, value: Any) -> Any:
        return refuse_bool(value)


class StackSpec(_Strict):
    driver: str = "auto"
    cuda: str = "auto"
    cudnn: str = "auto"
    framework: FrameworkName = "none"
    framework_version: str = "auto"
    # Install the system CUDA toolkit + cuDNN (framework wheels bundle their own; default off).
    cuda_toolkit: bool = False
    install: bool = False  # on machines you own: may gpucloud install the driver there (passwordless sudo)?

    @model_validator(mode="before")
    @classmethod
    def _split_pin(cls, data: Any) -> Any:
        """ "pytorch==2.0.1" -> framework pytorch + framework_version 2.0.1."""
        if not isinstance(data, dict) or not isinstance(data.get("framework"), str):
            return data
        name, sep, version = data["framework"].partition("==")
        if not sep:
            return data
        given = data.get("framework_version")
        if given not in (None, "auto") and str(given).strip() != version.strip():
            reject(
                f"pins version {version.strip()} but framework_version says {given}. Keep one of them",
                "framework",
            )
        if not version.strip():
            reject(f"'{data['framework']}' has no version after '=='. Expected e.g. pytorch==2.0.1", "framework")
        return {**data, "framework": name, "framework_version": version}

    @field_validator("driver", "cuda", "cudnn", mode="before", json_schema_input_type=str | int | float)
    @classmethod
    def _versions(cls, value: Any) -> str:
        """ "auto" or a version like 470 / 11.4 / 8.9 (numbers from YAML are taken as text)."""
        return _auto_or_version(
            value,
            VERSION_RE,
            "a version such as 11.4",
            "'{value}' is not a version. Expected auto or digits and dots, e.g. 470, 11.4 or 8.9",
        )

    @field_validator(
        "framework",
        mode="before",
        json_schema_input_type=Annotated[
            str, Field(pattern=r"^\s*(pytorch|tensorflow|none)\s*(==\s*[0-9][0-9A-Za-z.+!-]*)?\s*$")
        ],
    )
    @classmethod
    def _framework(cls, value: Any) -> str:
        expected = "pytorch, tensorflow or none, optionally pinned like pytorch==2.0.1"
        word = required_text(value, expected).lower()
        if word in FRAMEWORKS:
            return word
        close = FRAMEWORK_ALIASES.get(word) or did_you_mean(word, FRAMEWORKS)
        hint = f"Did you mean '{close}'? " if close else ""
        reject(f"unknown framework '{value}'. {hint}Expected {expected}")

    @field_validator("framework_version", mode="before", json_schema_input_type=str | int | float)
    @classmethod
    def _framework_version(cls, value: Any) -> str:
        return _auto_or_version(
            value,
            PKG_VERSION_RE,
            "a version such as 2.0.1",
            "'{text}' is not a version. Expected auto or a version such as 2.0.1",
        )


class JobSpec(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
    resources: Resources = Field(default_factory=Resources)
    num_nodes: int = Field(1, ge=1, le=64)
    stack: StackSpec = Field(default_factory=StackSpec)
    image: str = "auto"
    container: ContainerSpec | None = None  # the image setup and run execute in (docs/CONTAINERS.md)
    workdir: str = "."
    env: dict[EnvKey, EnvValue] = Field(default_factory=dict)
    secrets: list[EnvKey] = Field(default_factory=list)  # names only; values from the caller (spec_secrets.py)
    inputs: dict[DataPath, InputSource] = Field(default_factory=dict)  # machine path -> source (spec_data.py)
    outputs: dict[DataPath, OutputDest] = Field(default_factory=dict)  # machine path -> bucket prefix
    outputs_sync: Literal["end", "interval"] = "end"  # interval: also every checkpoint_interval
    setup: str | None = None
    run: str
    artifacts: list[ArtifactPath] = Field(default_factory=list)
    ports: PortList = Field(default_factory=list)  # node ports `gpucloud ssh` forwards to the caller (docs/SSH.md)
    max_duration: int = Field(6 * 3600, ge=MIN_DURATION_S, le=MAX_DURATION_S)  # seconds; input "90m" / "6h" / "2d"
    max_cost: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # USD for the whole run (docs/SPOT.md)
    checkpoint: str | None = None  # folder under the job's cwd kept across attempts (docs/SPOT.md)
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL_S  # seconds between checkpoint uploads
    recovery: Recovery | None = None  # relaunch on preemption / lost / no capacity
    keep: KeepSeconds = None  # seconds the machine waits idle for the next job, within max_duration (docs/KEEP.md)
    source: Path | None = Field(None, exclude=True)  # the job file it came from (not part of the format)

    def price_cap(self) -> tuple[float | None, str]:
        """The most a node-hour may cost, and the words that say why: max_price_per_hour, or less
        where max_cost could not pay for max_duration on every node at a higher price."""
        cap, why = self.resources.max_price_per_hour, "max_price_per_hour"
        if self.max_cost is not None:
            hours = self.num_nodes * self.max_duration / 3600
            if cap is None or self.max_cost / hours < cap:
                cap = self.max_cost / hours
                why = f"max_cost ${self.max_cost:g} over {self.max_duration / 3600:g} h x {self.num_nodes} node(s)"
        return cap, why

    def workdir_path(self) -> Path:
        """workdir is relative to the job file's folder (like docker-compose), else to the cwd."""
        base = self.source.parent if self.source else Path.cwd()
        return (base / self.workdir).resolve()

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> str:
        """Says which rule the name breaks and offers a fixed-up name, rather than a bare regex."""
        rule = "lowercase letters, digits and dashes, 1-40 characters, not starting or ending with a dash"
        text = required_text(value, f"a job name of {rule}, e.g. mnist-k80")
        if NAME_RE.fullmatch(text):
            return text
        fixed = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", text.lower()))[:40].strip("-")
        if len(text) > 40:
            problem = f"is {len(text)} characters long; at most 40 are allowed"
        elif text != text.lower():
            problem = f"'{text}' has upper-case letters"
        elif text.startswith("-") or text.endswith("-"):
            problem = f"'{text}' starts or ends with a dash"
        else:
            bad = sorted({c for c in text if not re.fullmatch(r"[a-z0-9-]", c)})
            problem = f"'{text}' contains {', '.join(repr(c) for c in bad)}"
        hint = f" Did you mean '{fixed}'?" if fixed and NAME_RE.fullmatch(fixed) else ""
        reject(f"{problem}. Expected {rule}.{hint}".rstrip("."))

    @field_validator("resources", "stack", mode="before")
    @classmethod
    def _empty_section(cls, value: Any) -> Any:
        """`stack:` with every line commented out is YAML null: treat it as the defaults."""
        return {} if value is None else value

    @field_validator("num_nodes", mode="before")
    @classmethod
    def _num_nodes(cls, value: Any) -> Any:
        return refuse_bool(value)

    @field_validator("image", mode="before", json_schema_input_type=Annotated[str, Field(pattern=IMAGE_PATTERN)])
    @classmethod
    def _image(cls, value: Any) -> str:
        expected = "auto, an AMI id such as ami-0abcdef1234567890, or an Azure image URN Publisher:Offer:Sku:Version"
        text = required_text(value, expected)
        kind = image_kind(text)
        if kind is not None:
            return "auto" if kind == "auto" else text
        if text.lower().startswith("ami-"):
            reject(
                f"'{text}' is not an AMI id: expected ami- and 8 to 17 lower-case hex digits, "
                "e.g. ami-0abcdef1234567890"
            )
        if ":" in text:
            reject(
                f"'{text}' is not an Azure image URN: expected 4 parts Publisher:Offer:Sku:Version, e.g. "
                "Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest"
            )
        reject(f"'{text}' is not an image. Expected {expected}")

    @field_validator("workdir", mode="before")
    @classmethod
    def _workdir(cls, value: Any) -> str:
        return required_text(value, "a folder to upload, relative to the job file, e.g. .")

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("inputs", "outputs", mode="before")
    @classmethod
    def _data(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("secrets", mode="before")
    @classmethod
    def _secrets(cls, value: Any) -> Any:
        return [] if value is None else value

    @model_validator(mode="after")
    def _secret_not_env(self) -> JobSpec:
        both = sorted(set(self.secrets) & set(self.env))
        if both:
            reject(
                f"{both[0]} is in env too. A secret's value comes from the caller, never the file: remove it from env",
                "secrets",
            )
        login = self.container.login if self.container else None
        if login and login.password_secret not in self.secrets:
            reject(
                f"{login.password_secret} is not in secrets. A registry password comes from the caller: add "
                f"`secrets: [{login.password_secret}]` and set it in your environment",
                "container",
                "login",
                "password_secret",
            )
        return self

    @field_validator("setup", mode="before")
    @classmethod
    def _setup(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return required_text(value, "a shell command run once before run, e.g. pip install -r requirements.txt")

    @field_validator("run", mode="before")
    @classmethod
    def _run(cls, value: Any) -> str:
        return required_text(value, "the shell command that runs the job, e.g. python train.py")

    @field_validator("artifacts", mode="before", json_schema_input_type=list[str] | str | None)
    @classmethod
    def _artifacts(cls, value: Any) -> Any:
        if value is None:
            return []
        return [value] if isinstance(value, str) else value

    @field_validator(
        "max_duration",
        mode="before",
        json_schema_input_type=Annotated[int, Field(ge=MIN_DURATION_S, le=MAX_DURATION_S)]
        | Annotated[str, Field(pattern=DURATION_PATTERN)],
    )
    @classmethod
    def _max_duration(cls, value: Any) -> int:
        seconds = parse_duration(value)
        if seconds < MIN_DURATION_S:
            reject(
                f"{describe(value)} is {seconds} s, shorter than the minimum of {MIN_DURATION_S} s. "
                "Expected e.g. 90m, 6h or 2d"
            )
        if seconds > MAX_DURATION_S:
            reject(f"{describe(value)} is {format_duration(seconds)}, longer than the maximum of 30d")
        return seconds

    @field_validator("checkpoint", mode="before", json_schema_input_type=str | None)
    @classmethod
    def _checkpoint(cls, value: Any) -> str | None:
        return checkpoint_path(value)

    @field_validator(
        "checkpoint_interval",
        mode="before",
        json_schema_input_type=int | Annotated[str, Field(pattern=DURATION_PATTERN)],
    )
    @classmethod
    def _checkpoint_interval(cls, value: Any) -> int:
        return checkpoint_interval(value)

    @field_validator("recovery", mode="before")
    @classmethod
    def _recovery(cls, value: Any) -> Any:
        return {} if value is True else (None if value is False else value)

    @model_validator(mode="after")
    def _needs_hardware(self) -> JobSpec:
        """The planner needs a GPU or an instance type to pick machines; only local runs need neither."""
        res = self.resources
        if res.gpu is None and res.instance_type is None and any(providers.info(c).priced for c in res.cloud):
            unpriced = " or ".join(n for n in providers.names() if not providers.info(n).priced)
            reject(
                "needs a GPU or an instance type. Add gpu: MODEL:COUNT (e.g. gpu: T4:1) or "
                f"instance_type: g4dn.xlarge under resources; only cloud: {unpriced} (in the file or as --cloud) "
                "runs without either",
                "resources",
            )
        return self
