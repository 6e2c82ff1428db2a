# linac on CUDA 13 / Ubuntu 24.04: `docker build -t linac .` then
# `docker run --gpus all -v $PWD/data:/linac/data -v $PWD/runs:/linac/runs linac train configs/quickstart.json`
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /linac
COPY scripts/setup.sh scripts/setup.sh
RUN bash scripts/setup.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLINAC_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=90 \
 && cmake --build build -j "$(nproc)" --target linac \
 && ln -s /linac/build/linac /usr/local/bin/linac
ENV OMP_WAIT_POLICY=passive
ENTRYPOINT ["linac"]
