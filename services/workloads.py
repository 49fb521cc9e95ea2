"""Generated workloads, pure NumPy: one block of columns per call, so the Spark
`sources` job, the benchmarks and the tests all draw the same tuples.

Arrivals are a Poisson process at `rate` tuples/s; the time field holds the
arrival instant (epoch ms, floored). The other fields depend on
`workload.kind`:

  equijoin  the equi-join workload: b-model keys over `domain` in the key fields and the
            other numbers, the first free string field padded so the JSON
            record is about `tuple_bytes` long.
  zipf      hot keys, on equijoin's tuples: `top_key_share` of the tuples take key 0,
            the rest draw Zipf keys over `domain` (key i with weight 1 / (i + 1)^zipf_exponent,
            so key 0 is also Zipf's most frequent): one key carrying a set share of the
            input, or a Zipf tail, or both.
  band      the handshake/SplitJoin band join, R(x, y, z) and S(a, b, c, d):
            ints uniform in 1..value_max, floats uniform in [1, value_max],
            strings 20 random letters, bools fair coins.
  images    the PSP paper's image join: every bytes field an RGB image (3 x `pixels` bytes),
            a scene's base image plus a little noise, the scene drawn
            uniformly among round(1 / selectivity); int fields a running id.
            Same-scene images always pass engine.udfs.pixel_similarity
            (threshold 0.9, tolerance 16), others practically never, so
            that share of pairs matches.
  productivity the spill paper's partition groups of different productivity (the 3-way
            join on one key field): each tuple picks a partition group g
            uniformly, then a key uniformly from g's key domain, ints whose
            key text hashes (Kafka's murmur2) to g, so the record lands in g.
  airline   the StreamReuse paper's Delta OIS example (section 2.1): streams flights,
            checkins, baggage and weather over one flight catalogue drawn
            from the workload random_state (`flight_catalogue`): carriers' shares
            of flights are Zipf (a few big carriers), each carrier mostly in
            its own terminal; flights, check-ins and bags pick a flight
            uniformly, weather a destination city.

Every kind: a stream named in workload.rate_factors runs at that multiple of
the caller's rate.

Domain sizing of kind productivity: the spill paper's tuple range R is the number of
distinct join values in a range of R tuples of a stream; its range join ratio j is the
results a tuple is expected to produce within one range. Group g has join
ratio j = join_ratios[g % len(join_ratios)] and a domain of
max(1, round(R / partitions / j)) keys: a range brings g about R / partitions
tuples per stream, so each of g's keys appears about j times per stream per
range, and a tuple meets about j same-key tuples of every other stream (j^2
results in a 3-way join). The generator is called per time batch and keeps no
state, so a range is measured in time: one range = R / rate seconds of a
stream. A window of that length holds j partners per stream; one of w ranges
holds w * j (the paper's "4 results in the first 30K tuples, 16 in the next"
for j = 2: 2^2, then (2 * 2)^2).

Callers seed the generator: the same (seed, stream, batch) gives the same batch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import numpy as np

from streamjoin.schemas.join_keys import key_text
from streamjoin.settings import JobSettings, StreamSpec
from streamjoin.settings.dev import AIRLINE_MAX_CARRIERS, AIRLINE_MAX_CITIES, WorkloadSpec
from streamjoin.topology.partitioner import partitions_for_keys

Columns = dict[str, np.ndarray]

STRING_CHARS = 20  # the benchmark's char[20]
NOISE = 6  # image noise in [-NOISE, NOISE]: two images of a scene differ by <= 12 per byte
_IDS_PER_MS = 1000  # images: ids of a batch starting at t0 ms are t0 * 1000, t0 * 1000 + 1, ...
# Entropy tags no stream index or batch number reaches, so that scene and
# sample generators never coincide with a batch's generator.
_SCENES = 2**32 - 1
_SAMPLE = 2**32 - 2
_CATALOGUE = 2**32 - 3


def poisson_times(rng: np.random.Generator, rate: float, t0: int, t1: int) -> np.ndarray:
    """Arrival instants (ms, float) of a rate-per-second Poisson process in [t0, t1)."""
    mean_gap = 1000.0 / rate
    expected = (t1 - t0) / mean_gap
    gaps = rng.exponential(mean_gap, int(expected + 6 * math.sqrt(expected) + 16))
    times = t0 + np.cumsum(gaps)
    while times[-1] < t1:  # the tail beyond six sigmas: draw on until past the interval
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(mean_gap, len(gaps)))])
    return times[times < t1]


def b_model_keys(rng: np.random.Generator, n: int, skew: float, domain: int) -> np.ndarray:
    """b-model keys in [0, domain): at each of log2(domain) levels the heavy (lower) half wins with `skew`."""
    levels = domain.bit_length() - 1
    light = rng.random((n, levels)) >= skew
    return light.astype(np.int64) @ (np.int64(1) << np.arange(levels, dtype=np.int64))


def zipf_keys(rng: np.random.Generator, n: int, exponent: float, domain: int, top_share: float = 0.0) -> np.ndarray:
    """n keys in [0, domain): key 0 with probability `top_share`, else key i with probability
    proportional to 1 / (i + 1)^exponent (inverse transform on the cumulative weights)."""
    drawn = np.searchsorted(_zipf_cdf(domain, float(exponent)), rng.random(n), side="right")
    keys = np.minimum(drawn, domain - 1).astype(np.int64)  # a draw of exactly 1.0 - eps past the last bound
    if top_share > 0:
        keys[rng.random(n) < top_share] = 0
    return keys


@functools.lru_cache(maxsize=8)
def _zipf_cdf(domain: int, exponent: float) -> np.ndarray:
    weights = np.arange(1, domain + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights) / weights.sum()
    cdf.setflags(write=False)
    return cdf


def zipf_shares(domain: int, exponent: float, top_share: float = 0.0) -> np.ndarray:
    """Each key's expected share of the tuples `zipf_keys` draws, float[domain]."""
    pdf = np.diff(np.r_[0.0, _zipf_cdf(domain, float(exponent))]) * (1 - top_share)
    pdf[0] += top_share
    return pdf


def equijoin_keys(rng: np.random.Generator, n: int, job: JobSettings) -> np.ndarray:
    """n join keys of the job's keyed workload: b-model (kind equijoin) or Zipf (kind zipf)."""
    w = job.workload
    if w.kind == "zipf":
        return zipf_keys(rng, n, w.zipf_exponent, w.domain, w.top_key_share)
    return b_model_keys(rng, n, w.skew, w.domain)


def generate(job: JobSettings, stream: int, rng: np.random.Generator, t0_ms: int, t1_ms: int,
             rate: float) -> Columns:
    """Stream `stream`'s tuples arriving in [t0_ms, t1_ms), one column per field, in arrival order."""
    arrivals = poisson_times(rng, rate * job.workload.rate_factors.get(job.streams[stream].name, 1.0), t0_ms, t1_ms)
    return _KINDS[job.workload.kind](job, job.streams[stream], rng, arrivals, t0_ms)


def sample(job: JobSettings, stream: int, n: int, seed: int) -> Columns:
    """n tuples of the stream's workload, one per millisecond from 0: values for calibration."""
    rng = np.random.default_rng([seed, stream, _SAMPLE])
    return _KINDS[job.workload.kind](job, job.streams[stream], rng, np.arange(n, dtype=np.float64), 0)


# ---------------------------------------------------------------- equijoin (the equi-join workload)


def _equijoin(job: JobSettings, spec: StreamSpec, rng: np.random.Generator, arrivals: np.ndarray,
              t0_ms: int) -> Columns:
    """Key fields and other numbers carry the key k (b-model, or Zipf for kind zipf); free strings
    are empty but the padding."""
    return _keyed_columns(job, spec, arrivals, equijoin_keys(rng, len(arrivals), job))


def _keyed_columns(job: JobSettings, spec: StreamSpec, arrivals: np.ndarray, k: np.ndarray) -> Columns:
    """The stream's columns for keys k: the time field the arrival ms, key fields and other numbers k,
    free strings empty but the first, padded so each JSON record is about workload.tuple_bytes long.

    job: the job; spec: the stream; arrivals: arrival instants (ms, float); k: one int64 key per arrival."""
    ts = np.floor(arrivals).astype(np.int64)
    free = [n for n, t in spec.fields.items() if t in ("str", "bytes") and n not in spec.key_fields]
    cols: Columns = {}
    for name, ftype in spec.fields.items():
        if name == spec.time_field:
            cols[name] = ts
        elif name in free:
            cols[name] = np.zeros(len(ts), "U1" if ftype == "str" else "S1")
        else:
            cols[name] = _from_key(k, ftype)
    if free:
        cols[free[0]] = _padding(spec, cols, job.workload.tuple_bytes, bytes_=spec.fields[free[0]] == "bytes")
    return cols


def _from_key(k: np.ndarray, ftype: str) -> np.ndarray:
    return {"int": lambda: k, "float": lambda: k.astype(np.float64), "bool": lambda: k % 2 == 1,
            "str": lambda: k.astype("U"), "bytes": lambda: k.astype("S")}[ftype]()


def _padding(spec: StreamSpec, cols: Columns, tuple_bytes: int, bytes_: bool) -> np.ndarray:
    """'x' * room, room = what brings each tuple's compact JSON (padding empty) to tuple_bytes."""
    room = np.maximum(tuple_bytes - json_lengths(spec, cols), 0)
    # np.strings.multiply cannot size an empty result (the warm-up batch has no tuples).
    pad = np.strings.multiply(np.array("x"), room) if len(room) else np.zeros(0, "U1")
    return pad.astype("S") if bytes_ else pad


def json_lengths(spec: StreamSpec, cols: Columns) -> np.ndarray:
    """Length of each tuple's compact JSON object (as Spark's to_json writes it, ASCII strings)."""
    n = len(cols[spec.time_field])
    total = np.full(n, 2 + len(spec.fields) - 1, np.int64)  # braces and commas
    for name, ftype in spec.fields.items():
        v = cols[name]
        if ftype == "bool":
            width = np.where(v, 4, 5)
        elif ftype in ("str", "bytes"):
            width = np.strings.str_len(v) + 2
        else:
            width = np.strings.str_len(v.astype("U"))
        total += len(name) + 3 + width  # "name":value
    return total


def json_values(spec: StreamSpec, cols: Columns) -> np.ndarray:
    """Each tuple's compact JSON object (fields in the stream's order, the encoding `json_lengths`
    measures), as NumPy bytes, for producers that write generated tuples themselves.

    spec: the stream; cols: its generated columns (int, float, bool and str fields; strings
    must need no escaping, as the generated padding does not)."""
    out = np.full(len(cols[spec.time_field]), "{")
    for i, (name, ftype) in enumerate(spec.fields.items()):
        v = cols[name]
        if ftype == "str":
            text = np.strings.add(np.strings.add('"', v.astype("U")), '"')
        elif ftype == "bool":
            text = np.where(v, "true", "false")
        elif ftype in ("int", "float"):
            text = v.astype("U")
        else:
            raise ValueError(f"JSON values are written for int, float, bool and str fields, not {ftype} ({name})")
        out = np.strings.add(np.strings.add(out, f'{"," if i else ""}"{name}":'), text)
    return np.strings.encode(np.strings.add(out, "}"))


# ---------------------------------------------------------------- band (handshake / SplitJoin)


def _band(job: JobSettings, spec: StreamSpec, rng: np.random.Generator, arrivals: np.ndarray, t0_ms: int) -> Columns:
    ts = np.floor(arrivals).astype(np.int64)
    return {name: ts if name == spec.time_field else _uniform(rng, ftype, len(ts), job.workload.value_max)
            for name, ftype in spec.fields.items()}


def _uniform(rng: np.random.Generator, ftype: str, n: int, value_max: int) -> np.ndarray:
    if ftype == "int":
        return rng.integers(1, value_max + 1, n, dtype=np.int64)
    if ftype == "float":
        return rng.uniform(1.0, value_max, n)
    if ftype == "bool":
        return rng.random(n) < 0.5
    letters = rng.integers(ord("a"), ord("z") + 1, (n, STRING_CHARS), dtype=np.uint8).view(f"S{STRING_CHARS}")[:, 0]
    return letters.astype("U") if ftype == "str" else letters


# ---------------------------------------------------------------- images (the PSP paper's image join)


def scenes(job: JobSettings) -> int:
    """How many scenes images are drawn from: a pair matches with probability 1 / scenes."""
    return max(1, round(1 / job.workload.selectivity))


def scene_image(job: JobSettings, scene: int) -> np.ndarray:
    """The scene's base image, uint8[3 x pixels]: the same in every stream."""
    rng = np.random.default_rng([job.workload.random_state, _SCENES, scene])
    return rng.integers(0, 256, 3 * job.workload.pixels, dtype=np.uint8)


def _images(job: JobSettings, spec: StreamSpec, rng: np.random.Generator, arrivals: np.ndarray,
            t0_ms: int) -> Columns:
    n = len(arrivals)
    picked = rng.integers(0, scenes(job), n)
    cols: Columns = {}
    for name, ftype in spec.fields.items():
        if name == spec.time_field:
            cols[name] = np.floor(arrivals).astype(np.int64)
        elif ftype == "bytes":
            cols[name] = _noisy_images(job, rng, picked)
        elif ftype == "int":
            # A running id without state shared between batches, which cover disjoint
            # intervals: increasing and unique while a stream stays below 1000 tuples per ms.
            cols[name] = t0_ms * _IDS_PER_MS + np.arange(n, dtype=np.int64)
        else:
            cols[name] = _uniform(rng, ftype, n, job.workload.value_max)
    return cols


def _noisy_images(job: JobSettings, rng: np.random.Generator, picked: np.ndarray) -> np.ndarray:
    """One image per tuple, its scene's base plus noise, as fixed-width byte strings (NumPy 'S')."""
    width = 3 * job.workload.pixels
    used, which = np.unique(picked, return_inverse=True)
    bases = np.stack([scene_image(job, int(s)) for s in used]) if len(used) else np.empty((0, width), np.uint8)
    noise = rng.integers(-NOISE, NOISE + 1, (len(picked), width), dtype=np.int16)
    pixels = np.clip(bases[which].astype(np.int16) + noise, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(pixels).view(f"S{width}").reshape(len(picked))


# ---------------------------------------------------------------- productivity (the spill paper's join ratios)


def group_key_field(spec: StreamSpec) -> str:
    """The stream's one join-key field, which carries kind productivity's keys.

    spec: the stream. Raises ValueError unless it has exactly one key field, of type int or str:
    the key text of both is the key's decimal, which the group key pools are hashed by."""
    if len(spec.key_fields) != 1 or spec.fields[spec.key_fields[0]] not in ("int", "str"):
        raise ValueError(f"workload.kind productivity joins on one int or str key field per stream: stream {spec.name} "
                         f"has key_fields {spec.key_fields}")
    return spec.key_fields[0]


def group_domains(job: JobSettings) -> np.ndarray:
    """Kind productivity: each partition group's key-domain size, int64[job.partitions]: max(1, round(R / P / j)) for
    R = workload.tuple_range, P = partitions and group g's ratio j = join_ratios[g % len(join_ratios)]
    (see the module docstring)."""
    ratios = np.asarray(job.workload.join_ratios)
    per_group = ratios[np.arange(job.partitions) % len(ratios)]
    return np.maximum(1, np.round(job.workload.tuple_range / job.partitions / per_group)).astype(np.int64)


@functools.lru_cache(maxsize=8)
def group_keys(partitions: int, size: int) -> np.ndarray:
    """The `size` smallest non-negative ints whose key text Kafka's partitioner sends to each partition.

    partitions: the input topics' partition count (the job's groups); size: keys per group.
    Returns int64[partitions, size], row g ascending, read-only: it is cached, so a batch
    reuses it rather than hashing again."""
    # Enough candidates that every group usually gets `size` on the first pass (four
    # standard deviations over the binomial mean); doubling covers the rest.
    n = partitions * (size + 4 * math.isqrt(size) + 16)
    while True:
        candidates = np.arange(n, dtype=np.int64)
        groups = partitions_for_keys(key_text([(candidates, "int")]), partitions)
        counts = np.bincount(groups, minlength=partitions)
        if counts.min() >= size:
            break
        n *= 2
    by_group = candidates[np.argsort(groups, kind="stable")]  # stable: ascending keys within a group
    starts = np.cumsum(counts) - counts
    pools = by_group[starts[:, None] + np.arange(size)]
    pools.setflags(write=False)
    return pools


def _productivity_groups(job: JobSettings, spec: StreamSpec, rng: np.random.Generator, arrivals: np.ndarray,
                          t0_ms: int) -> Columns:
    """A uniform partition group per tuple, then a key uniform over that group's domain (`group_domains`)
    from its key pool, so the record lands in the group; other fields as equijoin's.

    job: the job (partitions, workload); spec: the stream; rng: the batch's generator;
    arrivals: arrival instants (ms, float); t0_ms: the batch's start (unused: keys need no running id)."""
    group_key_field(spec)
    domains = group_domains(job)
    # One pool size for every group: a group of domain d draws from its pool's first d keys.
    pools = group_keys(job.partitions, int(domains.max()))
    g = rng.integers(0, job.partitions, len(arrivals))
    k = pools[g, rng.integers(0, domains[g])]
    return _keyed_columns(job, spec, arrivals, k)


# ---------------------------------------------------------------- airline (the StreamReuse paper's Delta OIS example)

CARRIER_CODES = ("DL", "AA", "UA", "WN", "B6", "AS", "LH", "AF", "BA", "KL",
                 "EK", "QR", "SQ", "NH", "JL", "CX", "AC", "QF", "NK", "F9")
CITY_CODES = ("ATL", "JFK", "LAX", "ORD", "DFW", "DEN", "SFO", "SEA", "MIA", "BOS",
              "LHR", "CDG", "FRA", "AMS", "MAD", "FCO", "DXB", "DOH", "SIN", "HND",
              "NRT", "HKG", "SYD", "YYZ", "MEX", "GRU", "ICN", "PEK", "BKK", "IST",
              "ZRH", "MUC", "DUB", "CPH", "LAS", "PHX", "MSP", "DTW", "CLT", "IAH")
CHECKIN_STATUS = ("open", "boarding", "closed", "delayed", "cancelled")
_CHECKIN_STATUS_SHARES = (0.45, 0.25, 0.2, 0.08, 0.02)
FORECASTS = ("clear", "cloudy", "rain", "snow", "storm", "fog")
AIRLINE_FIELDS: dict[str, dict[str, str]] = {
    "flights": {"num": "str", "carrier": "str", "terminal": "str", "gate": "str", "dest": "str", "ts": "int"},
    "checkins": {"flight": "str", "status": "str", "vacant_seats": "int", "ts": "int"},
    "baggage": {"flight": "str", "area": "str", "bags": "int", "ts": "int"},
    "weather": {"city": "str", "forecast": "str", "temp": "float", "ts": "int"},
}
_GATES_PER_TERMINAL = 30
_BELTS_PER_TERMINAL = 6
_OWN_TERMINAL = 0.8  # share of a carrier's flights at its home terminal
_MAX_SEATS = 250
assert len(CARRIER_CODES) == AIRLINE_MAX_CARRIERS and len(CITY_CODES) == AIRLINE_MAX_CITIES


@dataclasses.dataclass(frozen=True)
class FlightCatalogue:
    """The flights every airline stream refers to, one entry per flight (NumPy unicode arrays)."""

    num: np.ndarray
    carrier: np.ndarray
    terminal: np.ndarray
    gate: np.ndarray
    dest: np.ndarray


def carrier_shares(carriers: int, skew: float) -> np.ndarray:
    """Each carrier's share of flights, float[carriers]: Zipf, share of rank r proportional to 1 / r^skew."""
    weights = 1.0 / np.arange(1, carriers + 1, dtype=np.float64) ** skew
    return weights / weights.sum()


def flight_catalogue(workload: WorkloadSpec) -> FlightCatalogue:
    """The workload's flight catalogue, the same for every stream and batch (drawn from workload.random_state).

    Carrier c runs max(1, round(flights_per_carrier * carriers * share_c)) flights, numbered
    <code><3-5 digits>, 80% at its home terminal (c mod terminals), gates 1..30 of the terminal,
    destinations drawn with a mild hub skew among the first `cities` city codes."""
    return _catalogue(workload.random_state, workload.carriers, workload.carrier_skew, workload.flights_per_carrier,
                      workload.terminals, workload.cities)


@functools.lru_cache(maxsize=8)
def _catalogue(seed: int, carriers: int, skew: float, per_carrier: int, terminals: int,
               cities: int) -> FlightCatalogue:
    rng = np.random.default_rng([seed, _CATALOGUE])
    counts = np.maximum(1, np.round(per_carrier * carriers * carrier_shares(carriers, skew))).astype(np.int64)
    owner = np.repeat(np.arange(carriers), counts)
    codes = np.asarray(CARRIER_CODES[:carriers])
    # Distinct numbers within a carrier: a sorted sample of 100.. per carrier, ranked into place.
    numbers = np.concatenate([100 + np.sort(rng.choice(max(9900, int(n)), int(n), replace=False)) for n in counts])
    home = owner % terminals
    elsewhere = rng.random(len(owner)) >= _OWN_TERMINAL
    terminal_index = np.where(elsewhere, rng.integers(0, terminals, len(owner)), home)
    letters = np.asarray([chr(ord("A") + t) for t in range(terminals)])
    terminal = letters[terminal_index]
    gate = np.strings.add(terminal, _decimal(rng.integers(1, _GATES_PER_TERMINAL + 1, len(owner))))
    hubs = 1.0 / np.sqrt(np.arange(1, cities + 1))
    dest = np.asarray(CITY_CODES[:cities])[rng.choice(cities, len(owner), p=hubs / hubs.sum())]
    return FlightCatalogue(np.strings.add(codes[owner], _decimal(numbers)), codes[owner], terminal, gate, dest)


def _decimal(values: np.ndarray) -> np.ndarray:
    """Ints as decimal text, as wide as the longest: astype("U") alone makes every value 21 characters
    wide, which a block then stores (and a window keeps) per tuple."""
    text = values.astype("U")
    return text.astype(f"U{max(1, int(np.strings.str_len(text).max(initial=1)))}")


def airline_stream(spec: StreamSpec) -> str:
    """Which airline stream `spec` is (its name), after checking it has that stream's fields and time field ts.

    Raises ValueError naming the stream and what differs."""
    want = AIRLINE_FIELDS.get(spec.name)
    if want is None:
        raise ValueError(f"workload.kind airline generates streams {sorted(AIRLINE_FIELDS)}, not {spec.name!r}")
    if spec.fields != want or spec.time_field != "ts":
        raise ValueError(f"workload.kind airline: stream {spec.name} needs fields {want} with time_field ts, "
                         f"got {spec.fields} with time_field {spec.time_field}")
    return spec.name


def _airline(job: JobSettings, spec: StreamSpec, rng: np.random.Generator, arrivals: np.ndarray,
             t0_ms: int) -> Columns:
    """One airline stream's tuples: a flight (or city) per arrival and that stream's own readings.

    job: the job (workload's catalogue settings); spec: the stream; rng: the batch's generator;
    arrivals: arrival instants (ms, float); t0_ms: the batch's start (unused: no running ids)."""
    cols = _airline_columns(job.workload, airline_stream(spec), rng, np.floor(arrivals).astype(np.int64))
    return {f: cols[f] for f in spec.fields}


def _airline_columns(workload: WorkloadSpec, name: str, rng: np.random.Generator, ts: np.ndarray) -> Columns:
    """Stream `name`'s columns for tuples at times `ts` (int64 ms), drawn from `rng`."""
    n = len(ts)
    if name == "weather":
        return {"city": np.asarray(CITY_CODES[:workload.cities])[rng.integers(0, workload.cities, n)],
                "forecast": np.asarray(FORECASTS)[rng.integers(0, len(FORECASTS), n)],
                "temp": np.round(rng.normal(15.0, 10.0, n), 1), "ts": ts}
    catalogue = flight_catalogue(workload)
    flight = rng.integers(0, len(catalogue.num), n)
    if name == "flights":
        return {"num": catalogue.num[flight], "carrier": catalogue.carrier[flight],
                "terminal": catalogue.terminal[flight], "gate": catalogue.gate[flight],
                "dest": catalogue.dest[flight], "ts": ts}
    if name == "checkins":
        status = rng.choice(len(CHECKIN_STATUS), n, p=_CHECKIN_STATUS_SHARES)
        return {"flight": catalogue.num[flight], "status": np.asarray(CHECKIN_STATUS)[status],
                "vacant_seats": rng.integers(0, _MAX_SEATS + 1, n, dtype=np.int64), "ts": ts}
    belt = _decimal(rng.integers(1, _BELTS_PER_TERMINAL + 1, n))
    return {"flight": catalogue.num[flight], "area": np.strings.add(np.strings.add(catalogue.terminal[flight], "-belt"),
                                                                     belt),
            "bags": 1 + rng.poisson(0.6, n).astype(np.int64), "ts": ts}


_KINDS: dict[str, Callable[[JobSettings, StreamSpec, np.random.Generator, np.ndarray, int], Columns]] = {
    "equijoin": _equijoin, "zipf": _equijoin, "band": _band, "images": _images, "productivity": _productivity_groups,
    "airline": _airline}
