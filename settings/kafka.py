"""A job's Kafka settings: the `kafka:` section, the librdkafka properties every Kafka
client of the job gets (security protocol, SASL, TLS, timeouts), the properties it may not
set, and the `transactions:` section, the timeouts of the job's transactional producers.

Names are librdkafka's, dotted; `_` stands for `.` (environment variables
cannot hold dots, and no librdkafka property has an underscore).

Secrets. A secret property (`SECRET_KAFKA_SETTINGS`, or any property whose
last word is password, secret or passphrase) is held as a `KafkaSecret`, a
pydantic `SecretStr`: repr, str and JSON dumps of the settings show
`**********`. Any property's value may instead be a reference, read when the
settings load:
    {file: /path}   the file's text, trailing newline dropped (a Kubernetes
                    Secret mounted as files);
    {env: NAME}     the variable's value (a Secret passed by secretKeyRef).
A value read through a reference is held as a secret whatever its property:
whoever wrote a reference wanted the value out of the job file. A secret
remembers its reference, so a job file written for another process
(`JobSettings.job_file_data`) names the reference, never the value.
`STREAMJOIN_KAFKA__<NAME>` variables set properties too; a secret set that way
is held as the reference `{env: STREAMJOIN_KAFKA__<NAME>}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pydantic import Field, GetCoreSchemaHandler, SecretStr
from pydantic_core import core_schema

from streamjoin.settings.base import StrictModel

KafkaValue = str | int | float | bool
ENV_PREFIX = "STREAMJOIN_KAFKA__"
# librdkafka properties exactness or the design depends on: a job's `kafka:` section may not set them.
RESERVED_KAFKA_SETTINGS = {
    "bootstrap.servers": "give `bootstrap` instead",
    "group.id": "offsets are committed per job",
    "transactional.id": "one per worker, for exactly-once output",
    "enable.auto.commit": "offsets are committed with each cycle's output",
    "enable.auto.offset.store": "offsets are committed with each cycle's output",
    "isolation.level": "exactly-once reads read_committed",
    "enable.idempotence": "exactly-once output needs the idempotent producer",
    "partitioner": "results and repartitioned records use Kafka's murmur2 partitioner",
}

# librdkafka's sensitive properties. Not secret: sasl.username (an identity the
# broker logs anyway), ssl.ca.pem and ssl.certificate.pem (public certificates),
# *.location (paths; protect the files they name).
SECRET_KAFKA_SETTINGS = frozenset({
    "sasl.password",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.config",  # may carry an unsecured JWT's principal and extensions
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.keystore.password",
})
# The last word of a property name that marks a secret: covers properties librdkafka adds later.
SECRET_WORDS = frozenset({"password", "secret", "passphrase"})


def is_secret(name: str) -> bool:
    """Is librdkafka property `name` (dotted) a secret, to be masked wherever settings are shown?"""
    return name in SECRET_KAFKA_SETTINGS or name.rsplit(".", 1)[-1] in SECRET_WORDS


def dotted(name: str) -> str:
    """`name` as librdkafka spells it: lower case, `_` read as `.`."""
    return name.lower().replace("_", ".")


@dataclass(frozen=True)
class SecretSource:
    """Where a secret's value comes from: exactly one of `file` (an absolute path) or `env` (a variable name)."""

    file: Path | None = None
    env: str | None = None

    @classmethod
    def parse(cls, name: str, ref: Mapping[str, Any]) -> "SecretSource":
        """The reference `ref` ({file: PATH} or {env: NAME}) given for property `name`; ValueError names `name`."""
        if set(ref) not in ({"file"}, {"env"}) or not isinstance(next(iter(ref.values())), str):
            raise ValueError(f"{name}: a reference is {{file: PATH}} or {{env: NAME}}, got keys {sorted(ref)}")
        if "file" in ref:
            # Absolute, so the job file a launcher writes means the same in a child with another working directory.
            return cls(file=Path(ref["file"]).absolute())
        return cls(env=ref["env"])

    def read(self, name: str, environ: Mapping[str, str]) -> str:
        """The secret's value for property `name`, from the file or from `environ`.
        A missing, unreadable or empty source is a ValueError naming `name` (never the value)."""
        if self.file is not None:
            where = f"{{file: {self.file}}}"
            try:
                value = self.file.read_text(encoding="utf-8").rstrip("\r\n")
            except OSError as e:
                raise ValueError(f"{name}: cannot read {where}: {e.strerror}") from None
            except UnicodeDecodeError:  # its message would quote the bytes
                raise ValueError(f"{name}: {where} is not UTF-8 text") from None
        else:
            assert self.env is not None
            if self.env not in environ:
                raise ValueError(f"{name}: {{env: {self.env}}} names a variable that is not set")
            value, where = environ[self.env], f"{{env: {self.env}}}"
        if not value:
            raise ValueError(f"{name}: {where} is empty")
        return value

    def written(self) -> dict[str, str]:
        """The reference as a job file spells it."""
        return {"file": str(self.file)} if self.file is not None else {"env": str(self.env)}


class KafkaSecret(SecretStr):
    """A secret property's value: masked when shown (SecretStr), revealed only for librdkafka.
    `source` is the reference it was read through, None when it was given inline."""

    def __init__(self, secret_value: str, source: SecretSource | None = None) -> None:
        super().__init__(secret_value)
        self.source = source

    def written(self) -> str | dict[str, str]:
        """What a job file for another process holds: the reference if there is one, else the value."""
        return self.source.written() if self.source is not None else self.get_secret_value()

    @classmethod
    def __get_pydantic_core_schema__(cls, source: type[Any], handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        """Accepts only the instances `held` makes, in Python and JSON validation alike (a bare string
        stays a plain setting); JSON dumps show `**********`, as SecretStr's do."""
        return core_schema.no_info_plain_validator_function(
            cls._made_by_held, serialization=core_schema.plain_serializer_function_ser_schema(str, when_used="json"))

    @classmethod
    def _made_by_held(cls, value: Any) -> "KafkaSecret":
        if not isinstance(value, cls):
            raise ValueError("not a secret")
        return value


def held(name: str, value: Any, environ: Mapping[str, str]) -> Any:
    """Property `name`'s `value` as the settings hold it: a reference read into a `KafkaSecret`,
    a secret property's inline value wrapped in one, any other scalar as given. ValueError names `name`."""
    if isinstance(value, KafkaSecret):
        return value
    if isinstance(value, Mapping):
        source = SecretSource.parse(name, value)
        return KafkaSecret(source.read(name, environ), source)
    if not isinstance(value, (str, int, float, bool)):
        raise ValueError(f"{name}: give a string, number or boolean, or {{file: PATH}} or {{env: NAME}}; "
                         f"got a {type(value).__name__}")
    return KafkaSecret(str(value)) if is_secret(name) else value


def from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The properties `STREAMJOIN_KAFKA__<NAME>` variables set (any case, as pydantic-settings reads the
    others). A secret stays in the environment: it is held as the reference {env: <the variable>}."""
    found: dict[str, Any] = {}
    for var, value in environ.items():
        if var.upper().startswith(ENV_PREFIX) and len(var) > len(ENV_PREFIX):
            name = dotted(var[len(ENV_PREFIX):])
            found[name] = {"env": var} if is_secret(name) else value
    return found


def overlay(*layers: Any) -> Any:
    """The `kafka:` sections of file, environment and flags (None = layer absent), later ones winning per
    property. Shallow on purpose: a reference is one value, never merged into another one.
    A layer that is not a mapping is returned as it is, for validation to name the field."""
    merged: dict[str, Any] = {}
    for layer in layers:
        if layer is None:
            continue
        if not isinstance(layer, Mapping):
            return layer
        merged |= {dotted(str(k)): v for k, v in layer.items()}
    return merged


class TransactionSpec(StrictModel):
    """The job file's `transactions:` section: how long the job's transactional producers (a
    worker's cycle, a SplitJoin core and merger, the query router) and the broker wait on a
    transaction before giving up on it."""

    transaction_timeout_ms: int = Field(
        default=60_000, gt=0,
        description="the producers' transaction.timeout.ms: the broker aborts a transaction left open this long "
                    "(its producer crashed or stalled), so read_committed readers get past it; at most the "
                    "broker's transaction.max.timeout.ms")
    init_transactions_timeout_s: float = Field(
        default=30.0, gt=0,
        description="how long a producer's init_transactions call (which fences the previous incarnation of "
                    "its transactional id and settles its open transaction) waits for the broker per attempt")
    commit_timeout_s: float = Field(
        default=60.0, gt=0,
        description="how long a commit_transaction call waits for the broker to confirm a transaction's "
                    "output and offsets before it fails")


class ConsumerSpec(StrictModel):
    """The job file's `consumers:` section: how long the broker may hold an empty fetch of the job's
    consumers. An idle consumer fetches 1000 / wait times a second and every empty fetch costs the
    broker CPU in proportion to the partitions it names: shorter waits cost the broker more while
    idle; longer ones may add up to the wait to a record's hop on brokers that answer a waiting
    fetch late (the embedded Tansu under read_committed)."""

    fetch_wait_ms: int = Field(
        default=20, gt=0, le=60_000,
        description="fetch.wait.max.ms of the consumers that read data (sources, by-key and ring hops, "
                    "results): each hop's added delay at worst")
    control_fetch_wait_ms: int = Field(
        default=200, gt=0, le=60_000,
        description="fetch.wait.max.ms of the control-plane consumers (placement, moves, heartbeats), "
                    "which nothing waits on record by record")
