"""The REST API's request and response bodies (pydantic), and their conversion to the job model.

Sizes travel as strings people write ("20GiB") or as integer bytes; durations as "90s", "30m", "1h",
"2d" or seconds. Unknown fields are refused, so a typo ("gpu" for "gpus") is an error naming the field,
not a silently ignored wish. Types are strict: ``true`` is not a number, ``"8"`` is not an integer, and
NaN or Infinity is no number at all.

Every text field is checked before anything is stored: valid Unicode (a JSON ``"\ud800"`` escape is a
lone surrogate, which no file, process or JSON answer can carry) and bounded in size. The limits:

```text
command      1 to 4096 arguments; the program name non-empty; each argument at most 128 KiB of UTF-8
             and without NUL (Linux's MAX_ARG_STRLEN: execve refuses a longer one; docs/references.md)
env          at most 1024 variables; a name 1 to 1024 bytes without '=' or NUL; a value at most 128 KiB
command+env  at most 1 MiB of UTF-8 together (execve's total is 1/4 of the stack limit, 2 MiB by default,
             and the server's own environment needs its share)
cwd          at most 4096 bytes (PATH_MAX), without NUL
sizes        at most 2^60 bytes (1 EiB); SQLite stores 64-bit integers
```

The published schema (``/openapi.json``) is the truth about every one of these, and the server answers
422 exactly when a body does not match it (tests/server/test_openapi_truth.py walks it): bounds of
integer fields are integers, and an integer field takes ``8.0`` as 8, as JSON Schema counts it an
integer; the grammar of sizes and durations is published as each field's ``pattern`` (the same regular
expression the server matches with); a limit in bytes of UTF-8, which no standard keyword can state, is
published as ``x-maxUtf8Bytes`` beside the ``maxLength`` in characters. What no schema can state is
answered 400 naming the field: a size of zero bytes or not a whole number of bytes, a duration of zero
or of ten years or more, command and env over 1 MiB together (422: a documented limit), a topology need
for one GPU, and what this machine cannot ever run.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from gpuslice.errors import InvalidRequest, InvalidSize, UserError
from gpuslice.hardware.node import MAX_GPUS_PER_NODE
from gpuslice.ledger.placement import Refusal
from gpuslice.scheduler.reasons import PendingReason
from gpuslice.server.codec import spec_to_json
from gpuslice.server.store import JobRecord, TenantRecord
from gpuslice.units import SIZE_PATTERN, parse_size
from gpuslice.workload.job import (
    DEFAULT_TENANT,
    MAX_TENANT_WEIGHT,
    JobSpec,
    JobState,
    Priority,
    RestartPolicy,
    TopologyNeed,
)

__all__ = [
    "DURATION_PATTERN",
    "ERROR_RESPONSES",
    "MAX_BYTES_KEYWORD",
    "TENANT_PATTERN",
    "Decimal",
    "ErrorBody",
    "FaultOut",
    "FieldError",
    "JobOut",
    "MapEntryOut",
    "MapInfoOut",
    "MapOut",
    "MapValueIn",
    "PolicyIn",
    "PolicyOut",
    "StateName",
    "SubmitRequest",
    "TenantIn",
    "job_out",
    "named",
    "parse_duration",
    "spec_from_submit",
    "tenant_from_body",
]


def _decimal(text: Any) -> Any:
    """An integer in a URL is written in decimal digits: "3.0" or "1e3" is refused (422), as the schema's
    ``integer`` is read for text; pydantic alone would take "3.0" and refuse "1e3"."""
    if isinstance(text, str) and not re.fullmatch(r"-?[0-9]+", text):
        raise ValueError(f"{text[:40]!r} is not an integer in decimal digits")
    return text


Decimal = BeforeValidator(_decimal)  # last in an Annotated: it runs before what is left of it
StateName = Literal["PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "PREEMPTED"]

PriorityName = Literal["realtime", "high", "normal", "low", "idle"]
# A duration's grammar, published as the pattern of max_runtime: ASCII digits and blanks only (Python's
# \d would read "٢٠" as 20), in the dialect JSON Schema and Python share.
DURATION_PATTERN = r"^[\t-\r ]*([0-9]+(?:\.[0-9]+)?)[\t-\r ]*([smhd]?)[\t-\r ]*$"
_DURATION = re.compile(DURATION_PATTERN)
_SIZE = re.compile(SIZE_PATTERN)
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_DURATION_SECONDS = 10 * 365 * 86400
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_NAME = TENANT_PATTERN
# The schema keyword for a limit in bytes of UTF-8 (maxLength counts characters); OpenAPI 3.1 lets a
# schema carry "x-" keywords, and the server checks this one itself (_bounded).
MAX_BYTES_KEYWORD = "x-maxUtf8Bytes"
# JobSpec messages start with its field name; this maps them to the API's field names.
MAX_ARG_BYTES = 128 * 1024  # Linux MAX_ARG_STRLEN (32 pages of 4 KiB): execve(2)
MAX_ENV_VARS = 1024
MAX_ENV_NAME_BYTES = 1024
MAX_COMMAND_ENV_BYTES = 1024 * 1024
MAX_PATH_BYTES = 4096  # PATH_MAX
MAX_SIZE_BYTES = 2**60  # 1 EiB: far above any GPU, far below SQLite's 2^63
# Request models: unknown fields refused, strict JSON types, no NaN/Infinity.
_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
_SPEC_FIELD = {
    "gpu_memory_bytes": "memory",
    "max_runtime_seconds": "max_runtime",
    "mig_profile": "mig",
    "compute_percent": "compute_percent",
    "host_memory_bytes": "host_memory",
}


class FieldError(UserError):
    """A user error that names the request field it is about."""

    def __init__(self, field: str, message: str, http_status: int = 400) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.http_status = http_status  # 422 for a documented limit, as the schema's own checks answer


def utf8_bytes(text: str) -> int:
    """Size of ``text`` in UTF-8; ValueError for a lone surrogate (not valid Unicode)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode (a lone surrogate such as \\ud800)") from None


def _unicode(text: str) -> str:
    utf8_bytes(text)
    return text


def _bounded(limit: int) -> AfterValidator:
    def check(text: str) -> str:
        if utf8_bytes(text) > limit:
            raise ValueError(f"is longer than {limit} bytes of UTF-8")
        return text

    return AfterValidator(check)


def _whole(value: Any) -> Any:
    """8.0 as 8: JSON Schema counts a number with no fractional part an integer (Draft 2020-12 §6.1.1
    of the validation vocabulary), so an integer field takes it; 8.5 stays a float and is refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Whole = BeforeValidator(_whole)
_NO_NUL = r"^[^\x00]*$"
# Text: valid Unicode. Arg/EnvValue: also at most MAX_ARG_BYTES of UTF-8 and without NUL; the pattern and
# the byte limit (MAX_BYTES_KEYWORD) show in the schema, the validators check what a pattern cannot.
Text = Annotated[str, AfterValidator(_unicode)]
_ARG_SCHEMA = {"pattern": _NO_NUL, "maxLength": MAX_ARG_BYTES, MAX_BYTES_KEYWORD: MAX_ARG_BYTES}
Arg = Annotated[
    str,
    Field(pattern=_NO_NUL, max_length=MAX_ARG_BYTES, json_schema_extra={MAX_BYTES_KEYWORD: MAX_ARG_BYTES}),
    _bounded(MAX_ARG_BYTES),
]
EnvName = Annotated[
    str,
    Field(pattern=r"^[^=\x00]+$", max_length=MAX_ENV_NAME_BYTES,
          json_schema_extra={MAX_BYTES_KEYWORD: MAX_ENV_NAME_BYTES}),
    _bounded(MAX_ENV_NAME_BYTES),
]  # fmt: skip
EnvValue = Arg
PathText = Annotated[
    str,
    Field(pattern=_NO_NUL, max_length=MAX_PATH_BYTES, json_schema_extra={MAX_BYTES_KEYWORD: MAX_PATH_BYTES}),
    _bounded(MAX_PATH_BYTES),
]
ShortText = Annotated[str, Field(max_length=64), _bounded(256)]
# A size: text in the size grammar (its pattern published, matched by _size), or bytes, at least one.
SizeText = Annotated[str, Field(max_length=64, json_schema_extra={"pattern": SIZE_PATTERN})]
SizeBytes = Annotated[int, Field(ge=1, le=MAX_SIZE_BYTES), Whole]  # Whole first: it wraps what is left of it


def _names_as_property_names(schema: dict[str, Any]) -> None:
    """env's schema with the name rule under ``propertyNames`` and the value rule for every entry:
    pydantic writes the name pattern as ``patternProperties``, which lets a name outside it through."""
    (pattern, value), *_ = schema.pop("patternProperties").items()
    schema["propertyNames"] = {**schema.get("propertyNames", {}), "pattern": pattern, "minLength": 1}
    schema["additionalProperties"] = value


def _program_named(command: list[str]) -> list[str]:
    if not command[0]:
        raise ValueError("the program name (the first argument) must be non-empty")
    return command


def parse_duration(text: str | float | int, field: str = "max_runtime") -> float:
    """Seconds in "90", "90s", "30m", "1.5h", "2d" or a number; raises FieldError otherwise."""
    if isinstance(text, bool):
        raise FieldError(field, f"invalid duration {text!r}; use e.g. 90s, 30m, 1h, 2d")
    if isinstance(text, int | float):
        seconds = float(text)
        if not math.isfinite(seconds):
            raise FieldError(field, f"duration {text!r} must be a finite number of seconds")
    else:
        match = _DURATION.fullmatch(text)
        if match is None:  # 422: the text is not in the grammar the schema publishes as its pattern
            raise FieldError(field, f"invalid duration {text[:64]!r}; use e.g. 90s, 30m, 1h, 2d", 422)
        seconds = float(match.group(1)) * _SECONDS[match.group(2)]
    if not 0 < seconds < MAX_DURATION_SECONDS:
        raise FieldError(field, f"duration {text!r} must be positive and under ten years")
    return seconds


def _size(value: str | int, field: str) -> int:
    try:
        size = parse_size(value)
    except InvalidSize as err:  # 422 for text outside the published grammar, 400 for zero or a fraction
        outside = isinstance(value, str) and _SIZE.fullmatch(value) is None
        raise FieldError(field, str(err), 422 if outside else 400) from None
    except (OverflowError, ValueError):  # "1e400" as digits: a float that is no number of bytes
        raise FieldError(field, f"size {str(value)[:40]!r} is too large; at most 2^60 bytes") from None
    if size > MAX_SIZE_BYTES:
        raise FieldError(field, f"size {size} is too large; at most 2^60 bytes (1 EiB)")
    return size


class SubmitRequest(BaseModel):
    """A job to run: the command and the slice it needs. Memory is per GPU."""

    model_config = _STRICT

    command: Annotated[list[Arg], AfterValidator(_program_named)] = Field(
        min_length=1,
        max_length=4096,
        description="argv, program first (non-empty); each argument at most 128 KiB of UTF-8, no NUL",
        json_schema_extra={"prefixItems": [{"type": "string", "minLength": 1, **_ARG_SCHEMA}]},
    )
    gpus: Annotated[int, Whole] = Field(
        1, ge=0, le=MAX_GPUS_PER_NODE, description="GPUs; a share (memory/compute) is for 1"
    )
    memory: SizeText | SizeBytes | None = Field(
        None, description='GPU memory per GPU: "20GiB", "8000MiB" or bytes (at most 2^60)'
    )
    compute_percent: Annotated[int, Whole] = Field(
        0, ge=0, le=100, description="% of each GPU's SMs; 0 = not given"
    )
    mig: Annotated[str, Field(max_length=32), AfterValidator(_unicode)] = Field(
        "", description='a MIG profile, e.g. "3g.40gb"'
    )
    gpu_models: list[ShortText] = Field(default_factory=list, max_length=32, description="allowed; [] = any")
    excluded_gpu_models: list[ShortText] = Field(default_factory=list, max_length=32)
    exclusive: bool = False
    topology: Literal["any", "nvlink", "pcie-switch"] = "any"
    priority: PriorityName = "normal"
    tenant: str = Field(DEFAULT_TENANT, pattern=_NAME)
    preemptible: bool = True
    max_runtime: (
        Annotated[str, Field(max_length=64, json_schema_extra={"pattern": DURATION_PATTERN})]
        | Annotated[float, Field(gt=0, lt=MAX_DURATION_SECONDS)]
        | None
    ) = Field(None, description='"90s", "30m", "1h", "2d" or seconds; more than 0, under ten years')
    restart: Literal["never", "on-failure", "always"] = "never"
    max_restarts: Annotated[int, Whole] = Field(3, ge=0, le=1000)
    user: ShortText | None = Field(None, description="must be the server's user, if given")
    cwd: PathText = Field("", description="working directory; '' = the server's")
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=MAX_ENV_VARS,
        description="extra environment variables: at most 1024; names without '=' or NUL, values at most "
        "128 KiB; command and env at most 1 MiB together",
        json_schema_extra=_names_as_property_names,
    )
    host_memory: SizeText | SizeBytes | None = Field(
        None,
        description='host RAM the job may use, "8GiB" or bytes; beyond it the kernel OOM-kills in the job',
    )
    cpus: float = Field(
        0.0, ge=0, le=4096, description="CPU time per period, 1.5 = one and a half cores; 0: no limit"
    )


def spec_from_submit(body: SubmitRequest, server_user: str) -> JobSpec:
    """The JobSpec for a submit body; FieldError names the field of any problem."""
    total = sum(utf8_bytes(a) + 1 for a in body.command)
    total += sum(utf8_bytes(k) + utf8_bytes(v) + 2 for k, v in body.env.items())
    if total > MAX_COMMAND_ENV_BYTES:
        raise FieldError(
            "command", f"command and env hold {total} bytes; at most {MAX_COMMAND_ENV_BYTES} together", 422
        )
    memory = 0 if body.memory is None else _size(body.memory, "memory")
    runtime = None if body.max_runtime is None else parse_duration(body.max_runtime)
    host_memory = 0 if body.host_memory is None else _size(body.host_memory, "host_memory")
    try:
        return JobSpec(
            command=tuple(body.command),
            gpus=body.gpus,
            gpu_memory_bytes=memory,
            compute_percent=body.compute_percent,
            mig_profile=body.mig,
            gpu_models=tuple(sorted(set(body.gpu_models))),
            excluded_gpu_models=tuple(sorted(set(body.excluded_gpu_models))),
            exclusive=body.exclusive,
            topology=TopologyNeed(body.topology),
            priority=Priority.parse(body.priority),
            tenant=body.tenant,
            preemptible=body.preemptible,
            max_runtime_seconds=runtime,
            restart=RestartPolicy(body.restart),
            max_restarts=body.max_restarts,
            user=server_user,
            cwd=body.cwd,
            env=tuple(sorted(body.env.items())),
            host_memory_bytes=host_memory,
            cpus=body.cpus,
        )
    except InvalidRequest as err:
        raise named(err) from None


def named(err: InvalidRequest) -> UserError:
    """An InvalidRequest from JobSpec or the scheduler as a FieldError naming the API's field, when its
    message starts with a field name ("gpu_memory_bytes: …" becomes field "memory")."""
    head, sep, rest = str(err).partition(": ")
    if sep and head.isidentifier():  # keeps the error's status (a quota never met is 422)
        return FieldError(_SPEC_FIELD.get(head, head), rest, err.http_status)
    return err


class RefusalOut(BaseModel):
    """Why a pending job waits, as the one refusal record: ``code`` (the metrics' ``reason`` label) and,
    for a code that names a resource, what the job needs of it, what is free and the capacity, in
    ``unit`` (empty when the code names none: the sentence in ``reason`` has the details)."""

    code: str
    need: float
    free: float
    capacity: float
    unit: str

    @classmethod
    def of(cls, refusal: Refusal) -> RefusalOut:
        return cls(
            code=refusal.code.label,
            need=refusal.need,
            free=refusal.free,
            capacity=refusal.capacity,
            unit=refusal.unit.value,
        )


class JobOut(BaseModel):
    """A job as the API shows it: the spec as submitted plus what happened to it."""

    id: str
    state: str
    reason: str
    user: str
    tenant: str
    priority: str
    command: list[str]
    spec: dict[str, Any]
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    gpus: list[int]
    mig: dict[str, Any] | None
    pid: int | None
    exit_code: int | None
    exit_signal: int | None
    attempts: int
    suspended: bool
    stopping: str = Field(description="why the server is stopping it: preempt, cancel, limit, enforce; ''")
    refusal: RefusalOut | None = Field(
        default=None, description="a pending job: why it waits as a code with the amounts behind it"
    )


_SURROGATE = re.compile("[\ud800-\udfff]")
ENV_MASK = "********"  # what the API shows for every env value: names are shown, secrets never


def _valid_text(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings replaced by U+FFFD. Submits are checked since
    such text is refused, but a store written by an older server may hold some; one bad row must not
    make every list that contains it fail to encode."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list | tuple):
        return [_valid_text(v) for v in value]
    if isinstance(value, dict):
        return {_valid_text(k): _valid_text(v) for k, v in value.items()}
    return value


def job_out(job: JobRecord, waiting: PendingReason | None = None) -> JobOut:
    """``waiting``: why a pending job waits now (the scheduler's reason), shown instead of the stored one."""
    pending = waiting if waiting is not None and job.state is JobState.PENDING else None
    spec = spec_to_json(job.spec)
    spec["env"] = {name: ENV_MASK for name in spec["env"]}
    return JobOut(
        id=job.id,
        state=job.state.value,
        reason=_valid_text(pending.text if pending is not None else job.reason),
        user=job.user,
        tenant=job.spec.tenant,
        priority=job.spec.priority.name.lower(),
        command=_valid_text(list(job.spec.command)),
        spec=_valid_text(spec),
        submitted_at=job.submitted_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        gpus=list(job.gpus),
        mig=job.mig,
        pid=job.pid,
        exit_code=job.exit_code,
        exit_signal=job.exit_signal,
        attempts=job.attempts,
        suspended=job.suspended,
        stopping=job.stop,
        refusal=None if pending is None else RefusalOut.of(pending.refusal),
    )


class TenantIn(BaseModel):
    """A tenant's share and quotas; null = no limit. ``response`` tunes the graded memory response."""

    model_config = _STRICT

    weight: float = Field(1.0, gt=0, le=MAX_TENANT_WEIGHT, description="fair-share weight")
    max_gpus: float | None = Field(
        None, ge=0, le=MAX_GPUS_PER_NODE,
        description="GPUs its running jobs may hold; a share counts the larger of its memory and compute "
        "fractions of its GPU, a MIG instance its compute slices / 7",
    )  # fmt: skip
    max_gpu_memory: SizeText | SizeBytes | None = Field(
        None, description='total GPU memory, e.g. "160GiB", or bytes (at most 2^60)'
    )
    response: dict[Annotated[str, Field(max_length=64)], float | None] = Field(
        default_factory=dict,
        max_length=16,
        description="graded response settings, finite numbers or null (see GET /v1/tenants for defaults)",
    )


def tenant_from_body(name: str, body: TenantIn) -> TenantRecord:
    if not re.match(_NAME, name):
        raise FieldError("name", f"tenant name {name!r}: letters, digits, '.', '_', '-'; at most 64")
    memory = None if body.max_gpu_memory is None else _size(body.max_gpu_memory, "max_gpu_memory")
    return TenantRecord(name, body.weight, body.max_gpus, memory, dict(body.response))


# -- policies as programs --------------------------------------------------------------------------

MapScalar = bool | int | float | str  # a map key or value; bool first so JSON true stays a bool


class PolicyIn(BaseModel):
    """A policy file to verify and swap in: its text, and the name violations are reported under."""

    model_config = _STRICT

    filename: Text = Field(
        min_length=1, max_length=4096, pattern=_NO_NUL, description='shown in violations: "file:line: …"'
    )
    source: Text = Field(max_length=1_000_000, description="the file's text; the server verifies it")


class FaultOut(BaseModel):
    """How often one hook's answer was replaced by the built-in default, and why."""

    hook: str
    reason: str
    count: int


class MapInfoOut(BaseModel):
    """A loaded policy's map: its layout and how many entries it holds."""

    name: str
    key_type: str
    value_type: str
    max_entries: int
    entries: int


class PolicyOut(BaseModel):
    """What one policy family runs now. ``source``/``sha256``/``loaded_at`` are null for the built-in."""

    family: str
    name: str
    builtin: bool
    source: str | None
    sha256: str | None
    loaded_at: float | None
    detached: bool = Field(description="too many faults: the built-in decides until the next load")
    faults: list[FaultOut]
    maps: list[MapInfoOut]


class MapOut(BaseModel):
    """Every entry of a map, sorted by key."""

    family: str
    name: str
    key_type: str
    value_type: str
    max_entries: int
    entries: list[tuple[MapScalar, MapScalar]]


class MapEntryOut(BaseModel):
    """One entry; after an update, ``previous`` is the value it replaced (null for a new key)."""

    family: str
    map: str
    key: MapScalar
    value: MapScalar
    previous: MapScalar | None = None


class MapValueIn(BaseModel):
    """A map update: the value as JSON of the map's type, or as text ("2.5", "true") to be parsed."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # lax: "2.5" and 2.5 both parse

    value: bool | int | float | Annotated[str, Field(max_length=256), AfterValidator(_unicode)]


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: one message, the field it is about (if any), the error class."""

    detail: str
    field: str | None = None
    type: str


# The error answers every route may give, for the schema (each an ErrorBody).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 422)
}
