"""Test data made through the real services where a service exists (as users make it)."""

from datetime import datetime
from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from nodes.heartbeats import register_worker
from nodes.models import Node, ServedModel, Worker
from nodes.services import create_node


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.test")
    password = factory.django.Password("pw-correct-horse")


class ServedModelFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ServedModel
        django_get_or_create = ("name",)

    name = "llama-3-8b"
    min_vram_gb = 16
    typical_tokens_per_s = 50.0
    target_replicas = 2
    max_slots = 8


def make_node(
    *, provider: Any = None, online: bool = True, now: datetime | None = None, **fields: Any
) -> tuple[Node, str]:
    """A node as its owner creates it; online means its agent has been seen just now."""
    provider = provider or UserFactory()
    fields.setdefault("name", f"node-{Node.objects.count() + 1}")
    fields.setdefault("price_per_hour", "1.50")
    fields.setdefault("gpu_model", "A100")
    fields.setdefault("vram_gb", 80)
    node, token = create_node(provider=provider, **fields)
    if online:
        node.last_seen_at = now or timezone.now()
        node.save(update_fields=["last_seen_at"])
    return node, token


def make_ready_worker(node: Node, *, model: ServedModel | None = None, max_slots: int = 8) -> Worker:
    """A worker the node's agent registered (the path real workers take)."""
    model = model or ServedModelFactory()
    return register_worker(
        node=node, model=model.name, endpoint="http://127.0.0.1:9", max_slots=max_slots
    )
