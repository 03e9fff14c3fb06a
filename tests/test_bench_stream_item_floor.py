"""bench.delivery's item floors measure what they say: a stream of items from either producer
(the replica's kind, an async generator; and a plain generator on a thread of its own) reaches
its reader whole (every item), and each costs both processes some CPU."""

from __future__ import annotations

import asyncio

import pytest

from bench.harness.stream_item_floor import (
    PlainStreamProducer,
    RowsItem,
    StreamProducer,
    stream_item_cost,
)


@pytest.mark.parametrize("producer_class", [StreamProducer, PlainStreamProducer])
def test_every_item_reaches_the_reader_and_costs_its_producer(ray_cluster, producer_class):
    # stream_item_cost raises when its reader misses an item
    cost = asyncio.run(stream_item_cost(200.0, 2.0, RowsItem(8), producer_class))
    assert cost.producer_ms > 0 and cost.consumer_ms > 0, cost
