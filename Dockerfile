# The vlmserve image: the gateway (and the sim engine) that `vlmserve export k8s` deploys.
#
#   docker build -t vlmserve:0.1.0 .
#
# The tag is what `export k8s` uses when --vlmserve-image is not given (vlmserve:<version in pyproject.toml>;
# tests/unit/export/test_dockerfile.py keeps the two equal). Push it to your registry and pass
# --vlmserve-image registry.example.com/vlmserve:0.1.0. The engines run vLLM's own image, not this one.
FROM python:3.11-slim

# The package as the repository builds it, with what the gateway uses in a cluster: Redis for shared
# admission state (--state) and the Kubernetes client for --discover k8s:... (EndpointSlices).
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir ".[redis,k8s]" && rm -rf /src

# Not root: the manifests run it as this user (runAsNonRoot, fsGroup for the audit volume).
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent vlmserve
USER 10001
WORKDIR /
EXPOSE 8000
ENTRYPOINT ["vlmserve"]
CMD ["gateway", "--help"]
