# seeker on CPU. Build:  docker build -t seeker .
# Run:    docker run -p 8080:8080 -v seeker-data:/srv/seeker/data -v seeker-models:/srv/seeker/models seeker
# The default model, corpus and index are fetched on first start (never baked in).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Portable AVX2 build: .cargo/config.toml sets -C target-cpu=x86-64-v3 (a RUSTFLAGS
# variable, even an empty one, would replace it).
# candle-core 0.11's kernels and seeker's CPU attention in mistralrs-core, patched in by
# Cargo.toml (docs/kernels.md): fetched by cargo first.
RUN scripts/patch-candle.sh && cargo build --release --locked && cp target/release/seeker /usr/local/bin/seeker

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /srv/seeker
COPY --from=build /usr/local/bin/seeker /usr/local/bin/seeker
COPY config ./config
COPY scripts ./scripts
ENV SEEKER_BIN=/usr/local/bin/seeker
EXPOSE 8080
CMD ["sh", "-c", "scripts/fetch-defaults.sh && exec seeker serve --host 0.0.0.0 --port 8080"]
