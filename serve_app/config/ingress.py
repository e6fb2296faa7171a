"""The ingress: templates, API keys, priorities, length prediction, retries."""

from __future__ import annotations

import string
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from serve_app.config.base import StrictModel
from serve_app.config.deployment import DeploymentOptions

Priority = Literal["realtime", "batch"]
"""Priority classes: `realtime` is served first, `batch` yields and is shed first."""
PRIORITIES: tuple[Priority, ...] = get_args(Priority)
"""In serving order."""

INGRESS_DEPLOYMENT_DEFAULTS: dict[str, Any] = {
    "max_ongoing_requests": 1000,
    "max_queued_requests": 1000,
    "ray_actor_options": {"num_cpus": 0},
}
"""Serve options of the ingress that a config's `ingress.deployment` keeps unless
it names them (`ray_actor_options` merged key by key too)."""


def template_placeholders(template_name: str, text: str) -> set[str]:
    """The `{param}` names in a template text. Attribute access, indexing,
    conversions and format specs are refused, so a param can never reach into
    Python objects the way `str.format` would allow."""
    names: set[str] = set()
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"template {template_name!r}: {exc}") from None
    for _literal, field, format_spec, conversion in parsed:
        if field is None:
            continue
        if not field.isidentifier() or format_spec or conversion:
            raise ValueError(
                f"template {template_name!r}: placeholder {{{field}}} must be a plain "
                "name like {text}, without attributes, indexes or format specs"
            )
        names.add(field)
    return names


class TemplateConfig(StrictModel):
    """A server-side prompt template; clients send its name and `params`."""

    prompt: str
    """Text with `{param}` placeholders, rendered as the prompt (completions) or
    the user message (chat). Write `{{`/`}}` for literal braces."""
    system: str | None = None
    """Optional system message for chat requests (placeholders allowed)."""
    description: str = ""
    """What the template is for, shown to operators."""


class PredictorConfig(StrictModel):
    """How the ingress predicts a request's output length (which picks its pool).
    Per tenant (API key): a history per template or instruction fingerprint,
    else an online model over the prompt's hashed features, else `max_tokens`;
    learned from outputs that ended by themselves (finish reason `stop`), so no
    tenant moves another's predictions."""

    cold_start_tokens: int = Field(default=256, gt=0)
    """Prediction for a request with no trusted history or model and no `max_tokens`."""
    min_samples: int = Field(default=8, gt=0)
    """Observed generations a tenant's template or fingerprint needs before its
    history is trusted (each tenant warms its own)."""
    quantile: float = Field(default=0.9, gt=0, le=1)
    """Quantile of a history's observed lengths used as its prediction (high, so
    few requests overrun their bucket)."""
    window: int = Field(default=256, gt=0)
    """Most recent observations kept per tenant and template or fingerprint."""
    max_histories: int = Field(default=2048, gt=0)
    """Most (tenant, template or fingerprint) histories kept; past it the least
    recently observed is dropped (it starts cold again). Memory stays within
    `max_histories` x `window` lengths however many tenants and prompts come."""
    model_min_samples: int = Field(default=32, gt=0)
    """Observed generations a tenant's online model needs before it is trusted."""
    hash_bits: int = Field(default=15, ge=8, le=22)
    """Each online model holds 2**hash_bits weights (and as many AdaGrad sums):
    8 bytes each, 256 KiB at 15."""
    learning_rate: float = Field(default=0.1, gt=0, le=1)
    """AdaGrad step of the online models."""
    max_models: int = Field(default=32, ge=0)
    """Most tenants with an online model (the least recently observed dropped
    first); 0 turns the models off."""


class PriorityConfig(StrictModel):
    """Priority classes: `realtime` is served first; `batch` yields and is shed first."""

    default: Priority = "realtime"
    """Priority of requests that name none (header `X-Priority` or field `priority`)."""
    batch_queue_share: float = Field(default=0.5, gt=0, le=1)
    """Share of each pool's queue that batch requests may fill; the rest is kept
    for realtime ones, so batch is refused first under load."""


class ApiKeyConfig(StrictModel):
    """One client's API key and limits. The key itself never sits in the config:
    give its SHA-256, or the environment variable or file that holds it."""

    name: str
    """Client name, used in metrics and logs."""
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """Hex SHA-256 of the key."""
    env: str | None = None
    """Environment variable (on the ingress replicas) holding the key. Every
    process Ray starts on those pods inherits it, engines included."""
    file: str | None = Field(default=None, pattern=r"^/")
    """Absolute path of a file (on the ingress replicas) holding the key, read
    once at start, surrounding whitespace dropped: a mounted Secret, so the key
    is in no process's environment."""
    requests_per_s: float | None = Field(default=None, gt=0)
    """Sustained request rate allowed (bursts up to one second's worth); None: unlimited."""
    tokens_per_min: int | None = Field(default=None, gt=0)
    """Prompt + output tokens allowed per minute; None: unlimited. A request
    reserves its prompt plus `max_tokens` (else the model's whole context; the
    key's whole bucket when that is unset too) when admitted, and settles to
    the tokens it used when it ends."""
    ingress_skew: float = Field(default=1.5, ge=1)
    """How unevenly Serve's proxy may spread this client's requests over the
    ingress replicas before it meets a 429 below its limits. Each replica keeps
    its own buckets (no shared store) at `min(1, ingress_skew / n)` of the
    limits with n replicas: below its limits the client is never refused while
    no replica gets more than `ingress_skew / n` of its traffic, and it never
    gets more than `min(ingress_skew, n)` times its limits in all. 1 holds the
    limits exactly but refuses below them at any skew; n or more never refuses
    below them."""

    @model_validator(mode="after")
    def _one_key_source(self) -> ApiKeyConfig:
        if [self.sha256, self.env, self.file].count(None) != 2:
            raise ValueError(f"api key {self.name!r}: set exactly one of sha256, env or file")
        return self


class IngressConfig(StrictModel):
    """The OpenAI-compatible ingress."""

    max_body_bytes: int = Field(default=1_048_576, gt=0)
    """Largest request body accepted; larger ones get 413."""
    body_read_timeout_s: float = Field(default=30.0, gt=0)
    """Longest the whole request body may take to arrive; a slower client gets
    408 (`request_timeout`), so trickled bodies cannot hold the ingress. The
    clock includes Serve's proxy-to-replica hops, and the default lets a
    `max_body_bytes` body through at about 35 KB/s."""
    max_body_reads: int = Field(default=64, gt=0)
    """Request bodies one ingress replica reads at once; a request past it gets
    503 (`overloaded`) + `Retry-After` at once, before its body is read. Each
    body being read holds one of the replica's `max_ongoing_requests` for up to
    `body_read_timeout_s`, so this bound, well below that, keeps slow or
    stalled bodies from taking every slot: a request that comes during such a
    flood is answered (or refused) at once instead of waiting in Serve's proxy."""
    max_stop_sequences: int = Field(default=4, gt=0)
    """Most `stop` strings one request may send (OpenAI's limit is 4)."""
    max_stop_chars: int = Field(default=256, gt=0)
    """Longest `stop` string accepted, in characters (vLLM's detokenizer holds back
    up to the longest stop string's length of output while it matches)."""
    max_messages: int = Field(default=2048, gt=0)
    """Most `messages` one chat request may send."""
    max_error_chars: int = Field(default=4096, ge=256)
    """Longest error message (and `param`) sent back; a longer one is cut, and a
    list of validation problems says how many more there were."""
    gzip_min_bytes: int = Field(default=1024, ge=0)
    """Responses at least this large are gzip-compressed for clients that accept it."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Longest a request may take: a non-streamed one then gets 504, a stream an
    error event. Enforced by the ingress itself, whatever timeout a client asks
    Serve's proxy for."""
    queue_timeout_s: float = Field(default=60.0, gt=0)
    """Longest a request waits in a pool's queue for a slot before 503 +
    `Retry-After` (also while a pool scales up from zero)."""
    first_token_timeout_s: float = Field(default=120.0, gt=0)
    """Longest an attempt may wait for its first output (prefill, and a wait
    inside the engine when its KV cache is full) before its replica counts as
    hung and the request is re-sent or resumed elsewhere. Waiting in the
    ingress's own queue does not count: that is `queue_timeout_s`."""
    stream_idle_timeout_s: float = Field(default=60.0, gt=0)
    """Longest a running attempt may go without output once its first chunk
    came before its replica counts as hung and the request resumes
    elsewhere, or ends with an error event when no retry is left."""
    predictor: PredictorConfig = Field(default_factory=PredictorConfig)
    """Output-length prediction."""
    priorities: PriorityConfig = Field(default_factory=PriorityConfig)
    """Priority classes."""
    api_keys: list[ApiKeyConfig] = Field(default_factory=list)
    """Accepted API keys (`Authorization: Bearer <key>`); empty: no authentication."""
    max_attempts: int = Field(default=3, gt=0)
    """Tries per request when a replica is lost (a started stream resumes from
    the tokens already sent)."""
    retry_backoff_s: float = Field(default=0.5, ge=0)
    """Wait before the second try; doubles per further try."""
    deployment: DeploymentOptions = Field(default_factory=lambda: DeploymentOptions(**INGRESS_DEPLOYMENT_DEFAULTS))
    """Ray Serve options of the ingress replicas, over `INGRESS_DEPLOYMENT_DEFAULTS`
    key by key (a config naming only `num_replicas` keeps the bounded queue).
    Serve's proxy queues at most `max_queued_requests` for them and answers 503
    past it (unbounded in Serve's default), so slow clients cannot pile up
    without limit."""

    @field_validator("deployment", mode="before")
    @classmethod
    def _over_defaults(cls, given: Any) -> Any:
        if isinstance(given, DeploymentOptions):
            given = given.model_dump(exclude_unset=True)
        if not isinstance(given, dict):
            return given  # let the model refuse it
        actor = {**INGRESS_DEPLOYMENT_DEFAULTS["ray_actor_options"], **(given.get("ray_actor_options") or {})}
        return {**INGRESS_DEPLOYMENT_DEFAULTS, **given, "ray_actor_options": actor}
