"""Idempotent demo data: accounts and the served models. Running it twice reuses everything."""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from nodes.models import ServedModel

DEMO_USERS = [
    # username, password, staff
    ("owner", "owner-pass-123", False),
    ("renter", "renter-pass-123", False),
    ("staff", "staff-pass-123", True),
]

DEMO_MODELS = [
    # name, min VRAM, typical tokens/s, target replicas
    ("llama-3-8b", 16, 60.0, 2),
    ("qwen-2.5-32b", 40, 30.0, 1),
]


class Command(BaseCommand):
    help = "Create the demo accounts and served models (safe to run again)."

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        for username, password, staff in DEMO_USERS:
            user, created = User.objects.get_or_create(username=username, defaults={"is_staff": staff, "is_superuser": staff})
            if created:
                user.set_password(password)
                user.save(update_fields=["password"])
        for name, vram, tps, replicas in DEMO_MODELS:
            ServedModel.objects.get_or_create(
                name=name, defaults={"min_vram_gb": vram, "typical_tokens_per_s": tps, "target_replicas": replicas}
            )
        self.stdout.write("Demo logins: " + ", ".join(f"{u} / {p}" for u, p, _ in DEMO_USERS))
