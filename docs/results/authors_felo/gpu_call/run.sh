#!/bin/bash
# Felo/Velo side by side on the GPU machine: the authors' code (Felo, Velo) and pflower (felo, velo),
# seeds 1 and 2, all eight at once. Run from the repo root; $OUT comes back.
# As run on 2026-11-27 (an H100; TL=500), from .gpu/ and .whl/, folders carried beside the checkout:
# .whl/ the py3.12 wheels of flwr, hydra and their needs (that machine has torch, no flwr) plus
# objgraph; .gpu/authors/ the set-up authors' main.py, parameters.py and modules/*.py;
# .gpu/fmnist/ Debian's Fashion-MNIST (the training images recompressed as .xz);
# .gpu/part_tenths.json from `felo_velo_setup --partition`. The authors' runs failed at import
# (tkinter, since removed by a set-up edit); the logs beside this file are that call's.
set -u
TL=${TL:-520}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, flwr, hydra; print('torch', torch.__version__, torch.cuda.is_available(), 'flwr', flwr.__version__)"
D=/tmp/data/fashion-mnist; mkdir -p $D
cp .gpu/fmnist/*.gz $D/ && python3 -c "import lzma,sys; open('$D/train-images-idx3-ubyte','wb').write(lzma.open('.gpu/fmnist/train-images-idx3-ubyte.xz').read())"
for f in t10k-images-idx3-ubyte t10k-labels-idx1-ubyte train-labels-idx1-ubyte; do gunzip -c $D/$f.gz > $D/$f; done
rm $D/*.gz; ls -la $D
export PFLOWER_DATA=/tmp/data
L=/tmp/logs; mkdir -p $L
start_authors() {  # name flag seed
  w=/tmp/a_$1_$3; mkdir -p $w/data/FashionMNIST/raw $w/state_dict; cp -r .gpu/authors/* $w/; ln -s $D/* $w/data/FashionMNIST/raw/
  (cd $w && timeout $TL python3 main.py $2 --y_distillation_flag --KLD_flag --old_CNN --dataset Fmnist --GPU_num 0 --seed $3 --eval_every 10 > $L/authors_$1_s$3.log 2>&1; echo "rc=$? $(date +%T)" >> $L/authors_$1_s$3.log) &
}
start_pflower() {  # method seed extra...
  m=$1; s=$2; shift 2
  (timeout $TL python3 -m pflower.server_app.cli sim experiment=authors_felo_fmnist partition.path=$PWD/.gpu/part_tenths.json method=$m seed=$s backend=serial progress=false output_dir=/tmp/pfl/$m/seed$s "$@" > $L/pflower_${m}_s$s.log 2>&1; echo "rc=$? $(date +%T)" >> $L/pflower_${m}_s$s.log) &
}
date +%T
for s in 1 2; do
  start_authors velo --new_VAE $s
  start_pflower velo $s method.cvae_interval=2 method.cvae_loss=code
  start_authors felo --op $s
  start_pflower felo $s
done
pack() { tar czf $OUT/results.tgz.tmp --exclude=checkpoint.npz --exclude=client_state --exclude='*.pt' -C /tmp logs pfl $(cd /tmp; ls -d a_*/txt_result 2>/dev/null) 2>/dev/null; mv $OUT/results.tgz.tmp $OUT/results.tgz; }
for i in $(seq 1 40); do sleep 15; pack; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader >> $L/gpu.txt; if ! jobs -r | grep -q .; then break; fi; done
wait; pack; date +%T
grep -h "rc=" $L/*.log
