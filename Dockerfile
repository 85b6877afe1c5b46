# The service image: build in a Rust image, run on a slim Debian.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p seckill

FROM debian:bookworm-slim
# No tools beyond what the service needs (its health check uses bash's
# /dev/tcp), and a user of its own: the service never runs as root.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --no-create-home --shell /usr/sbin/nologin seckill
COPY --from=build /src/target/release/seckill /usr/local/bin/seckill
USER seckill
EXPOSE 8080
ENTRYPOINT ["seckill"]
CMD ["serve"]
