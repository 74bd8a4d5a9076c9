# The trainguard services' image (agent, streams, actuator, ... are subcommands).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends iproute2 nftables procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/trainguard
COPY pyproject.toml setup.py MANIFEST.in README.md ./
# the rule sets: the wheel ships rules/*.yaml inside the package (setup.py)
COPY rules ./rules
COPY trainguard ./trainguard
COPY sdk ./sdk
# The service depends on trainguard-sdk (the agent decodes its wire format): from ./sdk. The
# workload extra (PyTorch, numpy): the actuator launches the job of deploy/actuator/job.yaml
# (`python -m trainguard.workload.ddp`) from this image.
RUN pip install --no-cache-dir ./sdk ".[workload]"
ENTRYPOINT ["trainguard"]
