import hashlib
import secrets


def new_agent_token() -> str:
    return "agt_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    # Tokens are long random strings, so a fast unsalted hash is enough and
    # keeps the per-heartbeat lookup a single indexed equality.
    return hashlib.sha256(token.encode()).hexdigest()
