#!/bin/bash
# The authors' Velo (--new_VAE) on the GPU machine, seeds 1 and 2 at once, at a CVAE schedule that
# both codes take as flags: a training every 10 iterations after the warm-up (the paper's Table 4
# tries 1-10), 2 epochs each (pflower: method.cvae_interval=10 method.cvae_epochs=2, run on this
# project's CPU). The code's own schedule (every 2 iterations, 10 epochs: ~950,000 CVAE steps, ~45
# GPU-minutes a run) does not fit the 15 device-minutes a task is lent. Run from the repo root; $OUT
# comes back. Carried beside the checkout in .gpu/: authors/ (the set-up authors' main.py,
# parameters.py and modules/*.py, `felo_velo_setup`), fmnist/ (Debian's Fashion-MNIST, the training
# images recompressed as .xz), whl/ (objgraph's wheel: that machine has torch, tensorboard, tqdm,
# psutil, pandas, matplotlib).
set -u
TL=${TL:-560}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4 MKL_NUM_THREADS=4
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, torchvision; print('torch', torch.__version__, torchvision.__version__, torch.cuda.is_available())"
D=/tmp/data/fashion-mnist; mkdir -p $D
cp .gpu/fmnist/*.gz $D/ && python3 -c "import lzma; open('$D/train-images-idx3-ubyte','wb').write(lzma.open('.gpu/fmnist/train-images-idx3-ubyte.xz').read())"
for f in t10k-images-idx3-ubyte t10k-labels-idx1-ubyte train-labels-idx1-ubyte; do gunzip -c $D/$f.gz > $D/$f; done
rm $D/*.gz
L=/tmp/logs; mkdir -p $L
start_authors() {  # seed
  w=/tmp/a_velo_$1; mkdir -p $w/data/FashionMNIST/raw $w/state_dict; cp -r .gpu/authors/* $w/; ln -s $D/* $w/data/FashionMNIST/raw/
  c="python3 main.py --new_VAE --y_distillation_flag --KLD_flag --old_CNN --dataset Fmnist --GPU_num 0 --seed $1 --eval_every 10 --vae_every 10 --vae_epochs 2"
  echo "$c" > $L/authors_velo_s$1.command
  (cd $w && timeout $TL $c > $L/authors_velo_s$1.log 2>&1; echo "rc=$? $(date +%T)" >> $L/authors_velo_s$1.log) &
}
date +%T
for s in 1 2; do start_authors $s; done
pack() { tar czf $OUT/results.tgz.tmp -C /tmp logs $(cd /tmp; ls -d a_*/txt_result 2>/dev/null) 2>/dev/null; mv $OUT/results.tgz.tmp $OUT/results.tgz; }
for i in $(seq 1 60); do sleep 10; pack; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader >> $L/gpu.txt; if ! jobs -r | grep -q .; then break; fi; done
wait; pack; date +%T
grep -h "rc=" $L/*.log
