"""The Nexmark model: persons, auctions and bids of an online auction, drawn with NumPy a chunk
of events at a time, as Nexmark's generator (GeneratorConfig, PersonGenerator, AuctionGenerator,
BidGenerator) defines them; the `nexmark` bench writes them into Kafka and the peers read them.

Events. Event number n (0, 1, ...) has id n; n mod 50 says its kind: 0 a person, 1-3 an
auction, 4-49 a bid (the proportions 1:3:46). Its event time is base_ms + floor(n * 1e6 / rate)
/ 1000 (the inter-event delay at `rate` events/s). Out of order: events are emitted in groups of
`out_of_order_group`, the event at position k of a group being number base + (k * 953) mod g
(Nexmark's adjusted event number), so arrival order differs from event-time order by less than
a group; a group of 1 emits in order.

Ids and references (base 0, plus Nexmark's first ids 1000):
  person   the next person id (one per 50 events);
  auction  the next auction id; seller: with probability 1 - 1/hot_sellers_ratio the hot seller,
           the first person of the last 100 created, else any of the last `active_people` or
           up to 10 persons not created yet (Nexmark's lead); category 10 + uniform 0..4;
           expires: its time plus 1 + uniform below twice the time `in_flight_auctions`
           auctions take to be created;
  bid      auction: with probability 1 - 1/hot_auction_ratio the hot auction (the first of the
           last 100 created), else one of the last `in_flight_auctions` or up to 10 not
           created yet; bidder: with probability 1 - 1/hot_bidders_ratio the hot bidder (the
           second person of the last 100), else any active person or a lead.

Strings as Nexmark draws them: names from its first and last names, cities and states from its
lists (six states: AZ, CA, ID, OR, WA, WY), random lowercase strings with about one space in 13
for e-mails, item names and descriptions, credit cards as four groups of four digits, and an
`extra` of letters bringing each event to its average size (200, 500 and 100 bytes). Bids carry
a channel and a URL; channel is one of four names uniformly here (no query of the bench filters
on it). Nexmark's occasional delayed events (probDelayedEvent) are not drawn: its generator
does not apply them either.

References may point ahead (the leads): an auction's seller up to 10 persons (500 events)
later, a bid's auction up to 10 auctions (at most 250 events) later. `lead_ms` bounds that in
event time: the window a referring event must keep for its referent (bench/nexmark_queries.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Columns = dict[str, np.ndarray | pa.Array]  # int fields as NumPy, str fields as Arrow

PERSON, AUCTION, BID = "persons", "auctions", "bids"
KINDS = (PERSON, AUCTION, BID)
PROPORTIONS = {PERSON: 1, AUCTION: 3, BID: 46}
TOTAL = sum(PROPORTIONS.values())
FIRST_PERSON_ID = FIRST_AUCTION_ID = 1000
FIRST_CATEGORY = 10
CATEGORIES = 5
HOT_BATCH = 100  # the hot seller, auction and bidder are the first (bidder: second) of the last 100
PERSON_LEAD = AUCTION_LEAD = 10  # references to ids not created yet: at most this many ahead
# The most events after a referring event that its referent can come: 10 persons, one per 50
# events; 10 auctions span at most 4 epochs of 50 events plus the rest of the current one.
LEAD_EVENTS = {PERSON: PERSON_LEAD * TOTAL, AUCTION: (PERSON_LEAD // PROPORTIONS[AUCTION] + 2) * TOTAL}
STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent",
          "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
CHANNELS = ("Google", "Facebook", "Baidu", "Apple")

# Each stream's fields, in the order its JSON objects carry them (Nexmark's, in snake case).
FIELDS: dict[str, dict[str, str]] = {
    PERSON: {"id": "int", "name": "str", "email_address": "str", "credit_card": "str", "city": "str",
             "state": "str", "date_time": "int", "extra": "str"},
    AUCTION: {"id": "int", "item_name": "str", "description": "str", "initial_bid": "int", "reserve": "int",
              "date_time": "int", "expires": "int", "seller": "int", "category": "int", "extra": "str"},
    BID: {"auction": "int", "bidder": "int", "price": "int", "channel": "str", "url": "str", "date_time": "int",
          "extra": "str"},
}
TIME_FIELD = "date_time"


@dataclass(frozen=True)
class NexmarkModel:
    """NexmarkConfiguration's knobs that shape the events (its defaults), and the run's own:
    rate (events/s of event time, all kinds), base_ms (the first event's time), random_state."""

    rate: float = 10_000
    base_ms: int = 0
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    active_people: int = 1000
    in_flight_auctions: int = 100
    out_of_order_group: int = 1
    avg_person_bytes: int = 200
    avg_auction_bytes: int = 500
    avg_bid_bytes: int = 100
    random_state: int = 7

    @property
    def inter_event_us(self) -> float:
        return 1e6 / self.rate

    def timestamp(self, n: np.ndarray) -> np.ndarray:
        """Event time (epoch ms) of event numbers `n`."""
        return self.base_ms + np.floor(n * self.inter_event_us).astype(np.int64) // 1000

    def lead_ms(self, referent: str) -> int:
        """A bound on how much later in event time than a referring event its `referent` (PERSON
        or AUCTION) can be: a window longer than this on the referring stream keeps every pair."""
        return math.ceil(LEAD_EVENTS[referent] * self.inter_event_us / 1000) + 1


def adjusted_numbers(model: NexmarkModel, first: int, count: int) -> np.ndarray:
    """The event number emitted at positions first .. first + count - 1 (module docstring)."""
    k = np.arange(first, first + count, dtype=np.int64)
    g = model.out_of_order_group
    return (k // g) * g + (k * 953) % g


def kind_of(n: np.ndarray) -> np.ndarray:
    """0 person, 1 auction, 2 bid, by event number."""
    offset = n % TOTAL
    return np.where(offset < PROPORTIONS[PERSON], 0, np.where(offset < PROPORTIONS[PERSON] + PROPORTIONS[AUCTION], 1, 2))


def last_person(n: np.ndarray) -> np.ndarray:
    """The newest person id (base 0) at event n: its own id for a person."""
    p = PROPORTIONS[PERSON]
    return (n // TOTAL) * p + np.minimum(n % TOTAL, p - 1)


def last_auction(n: np.ndarray) -> np.ndarray:
    """The newest auction id (base 0) at event n: its own id for an auction."""
    p, a = PROPORTIONS[PERSON], PROPORTIONS[AUCTION]
    epoch, offset = n // TOTAL, n % TOTAL
    return np.where(offset < p, (epoch - 1) * a + a - 1, epoch * a + np.minimum(offset - p, a - 1))


def _below(rng: np.random.Generator, bound: np.ndarray | int) -> np.ndarray:
    """Uniform integers in [0, bound) per row."""
    return np.floor(rng.random(np.shape(bound)) * bound).astype(np.int64)


def _some_person(rng: np.random.Generator, model: NexmarkModel, n: np.ndarray) -> np.ndarray:
    """An active person or one of the next PERSON_LEAD (base 0), as PersonGenerator picks one."""
    people = last_person(n) + 1
    active = np.minimum(people, model.active_people)
    return people - active + _below(rng, active + PERSON_LEAD)


def _price(rng: np.random.Generator, size: int) -> np.ndarray:
    return np.round(10.0 ** (rng.random(size) * 6.0) * 100.0).astype(np.int64)


def _letters(rng: np.random.Generator, lengths: np.ndarray, spaces: bool = False) -> pa.StringArray:
    """Random lowercase strings of the given lengths (one space in 13 with `spaces`, then
    trimmed, as Nexmark's nextString), built as one Arrow buffer: no Python per string."""
    lengths = lengths.astype(np.int32)
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = rng.integers(ord("a"), ord("z") + 1, int(offsets[-1]), dtype=np.uint8)
    if spaces:
        data[rng.integers(0, 13, len(data)) == 0] = ord(" ")
    text = pa.StringArray.from_buffers(len(lengths), pa.py_buffer(offsets), pa.py_buffer(data))
    return pc.ascii_trim(text, " ") if spaces else text


def _string(rng: np.random.Generator, size: int, max_length: int) -> pa.StringArray:
    """Nexmark's nextString: 3 to max_length - 1 characters."""
    return _letters(rng, 3 + _below(rng, np.full(size, max_length - 3)), spaces=True)


def _extra(rng: np.random.Generator, current: np.ndarray, average: int) -> pa.StringArray:
    """Letters bringing each event from `current` bytes to `average` on average (+-20%)."""
    want = np.maximum(average - current, 0)
    delta = np.round(want * 0.2).astype(np.int64)
    size = want - delta + np.where(delta > 0, _below(rng, np.maximum(2 * delta, 1)), 0)
    return _letters(rng, size)


def _pick(rng: np.random.Generator, size: int, words: Sequence[str]) -> pa.Array:
    return pc.take(pa.array(words), pa.array(_below(rng, np.full(size, len(words)))))


def _concat(*pieces: pa.Array | str) -> pa.Array:
    """Row-wise concatenation of string arrays and constants."""
    return pc.binary_join_element_wise(*pieces, "")


def _lengths(*columns: pa.Array) -> np.ndarray:
    return sum((pc.binary_length(c).to_numpy(zero_copy_only=False) for c in columns),
               np.zeros(len(columns[0]), np.int64))


def persons(rng: np.random.Generator, model: NexmarkModel, n: np.ndarray) -> Columns:
    size = len(n)
    name = _concat(_pick(rng, size, FIRST_NAMES), " ", _pick(rng, size, LAST_NAMES))
    email = _concat(_string(rng, size, 7), "@", _string(rng, size, 5), ".com")
    groups = [pc.utf8_lpad(pc.cast(pa.array(rng.integers(0, 10_000, size)), pa.string()), 4, "0") for _ in range(4)]
    card = _concat(groups[0], " ", groups[1], " ", groups[2], " ", groups[3])
    city, state = _pick(rng, size, CITIES), _pick(rng, size, STATES)
    return {"id": last_person(n) + FIRST_PERSON_ID, "name": name, "email_address": email, "credit_card": card,
            "city": city, "state": state, "date_time": model.timestamp(n),
            "extra": _extra(rng, 8 + _lengths(name, email, card, city, state), model.avg_person_bytes)}


def auctions(rng: np.random.Generator, model: NexmarkModel, n: np.ndarray) -> Columns:
    size = len(n)
    hot = _below(rng, np.full(size, model.hot_sellers_ratio)) > 0
    seller = np.where(hot, (last_person(n) // HOT_BATCH) * HOT_BATCH, _some_person(rng, model, n)) + FIRST_PERSON_ID
    ts = model.timestamp(n)
    horizon_events = model.in_flight_auctions * TOTAL // PROPORTIONS[AUCTION]
    horizon_ms = model.timestamp(n + horizon_events) - ts
    initial = _price(rng, size)
    name, description = _string(rng, size, 20), _string(rng, size, 100)
    return {"id": last_auction(n) + FIRST_AUCTION_ID, "item_name": name, "description": description,
            "initial_bid": initial, "reserve": initial + _price(rng, size), "date_time": ts,
            "expires": ts + 1 + _below(rng, np.maximum(2 * horizon_ms, 1)), "seller": seller,
            "category": FIRST_CATEGORY + _below(rng, np.full(size, CATEGORIES)),
            "extra": _extra(rng, 48 + _lengths(name, description), model.avg_auction_bytes)}


def bids(rng: np.random.Generator, model: NexmarkModel, n: np.ndarray) -> Columns:
    size = len(n)
    newest = last_auction(n)
    hot = _below(rng, np.full(size, model.hot_auction_ratio)) > 0
    low = np.maximum(newest - model.in_flight_auctions, 0)
    auction = np.where(hot, (newest // HOT_BATCH) * HOT_BATCH, low + _below(rng, newest - low + 1 + AUCTION_LEAD))
    hot = _below(rng, np.full(size, model.hot_bidders_ratio)) > 0
    bidder = np.where(hot, (last_person(n) // HOT_BATCH) * HOT_BATCH + 1, _some_person(rng, model, n))
    five = np.full(size, 5)
    url = _concat("https://www.nexmark.com/", _letters(rng, five), "/", _letters(rng, five),
                  "/item.htm?query=1&channel_id=", pc.cast(pa.array(_below(rng, np.full(size, 1 << 20))), pa.string()))
    return {"auction": auction + FIRST_AUCTION_ID, "bidder": bidder + FIRST_PERSON_ID, "price": _price(rng, size),
            "channel": _pick(rng, size, CHANNELS), "url": url, "date_time": model.timestamp(n),
            "extra": _extra(rng, np.full(size, 32), model.avg_bid_bytes)}


def draw(model: NexmarkModel, chunk: int, chunk_events: int) -> dict[str, Columns]:
    """Chunk `chunk`'s events (positions chunk * chunk_events onwards), per kind in emission
    order: a function of the model and the chunk alone, so producers and checkers agree."""
    n = adjusted_numbers(model, chunk * chunk_events, chunk_events)
    kind = kind_of(n)
    rng = np.random.default_rng([model.random_state, chunk])
    return {name: make(rng, model, n[kind == i]) for i, (name, make) in enumerate(zip(KINDS, (persons, auctions, bids)))}
