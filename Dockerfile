# The service image: build in a Rust image, run on a slim Debian.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p seckill

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/seckill /usr/local/bin/seckill
EXPOSE 8080
ENTRYPOINT ["seckill"]
CMD ["serve"]
