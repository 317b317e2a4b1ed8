# voice_agent server image. Dependencies come from the same script as `scripts/run`
# (scripts/_env.sh), so there is one list of them: pyproject.toml.
#
#   docker build -t voice-agent .
#   docker run -p 8765:8765 -e VOICE_AGENT_TOKEN=change-me \
#       -v "$PWD/config:/app/config:ro" -v voice-agent-data:/data voice-agent

FROM python:3.11-slim AS build
WORKDIR /app
COPY pyproject.toml README.md ./
COPY scripts/ scripts/
COPY voice_agent/ voice_agent/
# The extras scripts/run installs; tests/test_dockerfile.py keeps the two in step.
RUN bash -c 'source scripts/_env.sh && ensure_installed "webrtc,srtp,whisper,nlu" && ensure_smart_turn && ensure_minilm' \
    && find .venv -name __pycache__ -prune -exec rm -rf {} +

FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OPENBLAS_NUM_THREADS=1 \
    VOICE_AGENT_DATA_DIR=/data
WORKDIR /app
RUN useradd --create-home --uid 10001 --user-group agent \
    && mkdir -p /data \
    && chown 10001:10001 /data
# The venv holds an editable install of /app, so both keep the same path as in the build stage.
COPY --from=build /app /app
COPY config/ config/
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8765
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["/app/.venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/healthz', timeout=2)"]
ENTRYPOINT ["/app/.venv/bin/voice-agent"]
# A public bind needs a token (VOICE_AGENT_TOKEN or server.api_tokens): the server refuses
# to listen on 0.0.0.0 without one.
CMD ["serve", "--config", "config/agents.yaml", "--host", "0.0.0.0", "--port", "8765"]
