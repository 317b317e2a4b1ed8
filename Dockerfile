# voice_agent: the same install script as scripts/run, so there is one list of dependencies.
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 VOICE_AGENT_DATA_DIR=/data
WORKDIR /app
COPY pyproject.toml README.md ./
COPY scripts/ scripts/
COPY voice_agent/ voice_agent/
RUN bash -c 'source scripts/_env.sh && ensure_installed ""'
COPY config/ config/
RUN useradd --create-home --uid 10001 agent && mkdir -p /data && chown agent /data
USER agent
VOLUME ["/data"]
ENTRYPOINT ["/app/.venv/bin/voice-agent"]
CMD ["chat", "--config", "config/agents.yaml"]
