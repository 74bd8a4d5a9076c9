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
# The rules' hot modules compiled with mypyc (trainguard/rules/native.py): mypyc type-checks
# against the installed dependencies, so the package is built again without isolation; the
# compiler is removed after, and the build fails if the rules would run as pure Python.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir "mypy>=1.11" "setuptools>=77" wheel \
    && TRAINGUARD_NATIVE=1 pip install --no-cache-dir --no-build-isolation --no-deps \
       --force-reinstall . \
    && cd / && python -c "from trainguard.rules import native; m = native.mode(); print(m); \
assert m.startswith('compiled'), m" \
    && cd /opt/trainguard && pip uninstall -y mypy \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y \
    && rm -rf /var/lib/apt/lists/* /opt/trainguard/build
ENTRYPOINT ["trainguard"]
