"""Idempotent demo data: accounts, served models, and a small fleet for `make run`.

Running it again reuses everything. The fleet's agent tokens and the demo API
key are shown only once by the platform, so they are kept in var/fleet.json
for `python -m simulator.fleet`; a token that no longer matches is rotated.
"""

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from inference.keys import create_api_key, hash_key
from inference.models import ApiKey
from nodes.models import Node, ServedModel
from nodes.services import create_node, rotate_agent_token
from nodes.tokens import hash_token

DEMO_USERS = [
    # username, password, staff
    ("owner", "owner-pass-123", False),
    ("renter", "renter-pass-123", False),
    ("staff", "staff-pass-123", True),
]

DEMO_MODELS = [
    # name, min VRAM, typical tokens/s, target replicas, on-demand floor
    ("llama-3-8b", 16, 60.0, 4, 1),
    ("qwen-2.5-32b", 40, 30.0, 2, 0),
]

# Three spot nodes over two capacity pools, three on-demand.
DEMO_FLEET = [
    {"name": "spot-node-1", "is_spot": True, "price": "0.90", "gpu": "A10G", "vram": 24, "type": "g5.xlarge", "zone": "us-east-1a"},
    {"name": "spot-node-2", "is_spot": True, "price": "0.90", "gpu": "A10G", "vram": 24, "type": "g5.xlarge", "zone": "us-east-1a"},
    {"name": "spot-node-3", "is_spot": True, "price": "2.10", "gpu": "L40S", "vram": 48, "type": "g6e.xlarge", "zone": "us-east-1b"},
    {"name": "ondemand-node-1", "is_spot": False, "price": "3.00", "gpu": "A10G", "vram": 24, "type": "g5.xlarge", "zone": "us-east-1a"},
    {"name": "ondemand-node-2", "is_spot": False, "price": "6.80", "gpu": "L40S", "vram": 48, "type": "g6e.xlarge", "zone": "us-east-1b"},
    {"name": "ondemand-node-3", "is_spot": False, "price": "32.00", "gpu": "A100", "vram": 80, "type": "p4d.24xlarge", "zone": "us-east-1c"},
]


class Command(BaseCommand):
    help = "Create the demo accounts, served models and fleet (safe to run again)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--no-fleet", action="store_true", help="accounts and models only")
        parser.add_argument("--fleet-file", default=str(Path(settings.VAR_DIR) / "fleet.json"))

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        users = {}
        for username, password, staff in DEMO_USERS:
            user, created = User.objects.get_or_create(username=username, defaults={"is_staff": staff, "is_superuser": staff})
            if created:
                user.set_password(password)
                user.save(update_fields=["password"])
            users[username] = user
        for name, vram, tps, replicas, floor in DEMO_MODELS:
            ServedModel.objects.get_or_create(
                name=name,
                defaults={"min_vram_gb": vram, "typical_tokens_per_s": tps, "target_replicas": replicas, "min_on_demand_replicas": floor},
            )
        if not options["no_fleet"]:
            self._fleet(users["owner"], users["renter"], Path(options["fleet_file"]))
        self.stdout.write("Demo logins: " + ", ".join(f"{u} / {p}" for u, p, _ in DEMO_USERS))

    def _fleet(self, owner: Any, renter: Any, path: Path) -> None:
        saved = json.loads(path.read_text()) if path.exists() else {}
        saved_tokens = {n["name"]: n["token"] for n in saved.get("nodes", [])}
        nodes = []
        for spec in DEMO_FLEET:
            node = Node.objects.filter(provider=owner, name=spec["name"]).first()
            token = saved_tokens.get(spec["name"])
            if node is None:
                node, token = create_node(
                    provider=owner, name=spec["name"], is_spot=spec["is_spot"], price_per_hour=spec["price"],
                    gpu_model=spec["gpu"], vram_gb=spec["vram"], cloud="aws", instance_type=spec["type"],
                    region="us-east-1", zone=spec["zone"], cloud_instance_id=f"i-demo-{spec['name']}",
                )
            elif token is None or hash_token(token) != node.agent_token_hash:
                token = rotate_agent_token(node=node)
            nodes.append({
                "name": spec["name"], "token": token, "gpu_model": spec["gpu"], "vram_gb": spec["vram"],
                "cloud": "aws", "instance_id": f"i-demo-{spec['name']}", "instance_type": spec["type"],
                "region": "us-east-1", "zone": spec["zone"],
            })
        key = saved.get("api_key")
        if not key or not ApiKey.objects.filter(key_hash=hash_key(key), revoked_at__isnull=True).exists():
            _, key = create_api_key(user=renter, name="demo traffic")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"nodes": nodes, "api_key": key, "models": [m[0] for m in DEMO_MODELS]}, indent=2))
        path.chmod(0o600)
