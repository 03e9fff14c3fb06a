"""bench.delivery's and bench.demo_checkpoints' item floors measure what they say: a stream of
items from each producer (the replica's kind, an async generator; a plain generator on a thread
of its own; a checkpoint socket read by a store's reader) reaches its reader whole (every item),
and each costs both processes some CPU."""

from __future__ import annotations

import asyncio

import pytest

from bench.harness.stream_item_floor import (
    CheckpointItem,
    PlainStreamProducer,
    RowsItem,
    SocketProducer,
    StreamProducer,
    stream_item_cost,
)


@pytest.mark.parametrize("producer_class", [StreamProducer, PlainStreamProducer])
def test_every_item_reaches_the_reader_and_costs_its_producer(ray_cluster, producer_class):
    # stream_item_cost raises when its reader misses an item
    cost = asyncio.run(stream_item_cost(200.0, 2.0, RowsItem(8), producer_class))
    assert cost.producer_ms > 0 and cost.consumer_ms > 0, cost


def test_checkpoints_over_the_socket_reach_the_reader_and_cost_both_ends(ray_cluster):
    cost = asyncio.run(stream_item_cost(100.0, 2.0, CheckpointItem(), SocketProducer))
    assert cost.producer_ms > 0 and cost.consumer_ms > 0, cost
