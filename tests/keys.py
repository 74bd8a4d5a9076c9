"""Fixed Ed25519 keys for tests: decide's command key and one actuator's key, with the
environment a ``trainguard decide`` / ``trainguard actuator`` subprocess needs to use them."""

from __future__ import annotations

from trainguard.actuators import signing

COMMAND = signing.parse_private("11" * 32, "tests")
ACTUATOR = signing.parse_private("22" * 32, "tests")
COMMAND_PUB = signing.KeySet.of([COMMAND.public()])
ACTUATOR_PUBS = signing.KeySet.of([ACTUATOR.public()])
TRUST = signing.Trust(decide=COMMAND_PUB, actuators=ACTUATOR_PUBS)


def env() -> dict[str, str]:
    return {signing.ENV_KEY: COMMAND.hex(), signing.ENV_PUB: COMMAND.public().hex(),
            signing.ENV_ACTUATOR_KEY: ACTUATOR.hex(),
            signing.ENV_ACTUATOR_PUBS: ACTUATOR.public().hex()}
