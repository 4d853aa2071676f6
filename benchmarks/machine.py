"""What every peer benchmark reports about the machine it ran on: the CPU, the load average
at the start and the end (a loaded machine is reported, never compensated), and the memory
bandwidth that bounds decode (benchmarks/generate_bench.py, benchmarks/quantized_bench.py)."""

import os
import platform
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def cpu_model() -> str:
    """The processor's model name (/proc/cpuinfo), or the platform's word for it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def _best_seconds(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def native_read(mib: int, threads: int, repeats: int) -> float:
    """The all-core read in bytes/s by benchmarks/read_probe.c (64-byte vector loads on
    every thread, as a decode kernel streams), built here with the C compiler; 0.0
    without one."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return 0.0
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "read_probe")
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "read_probe.c")
        built = subprocess.run([cc, "-O2", "-march=native", "-pthread", "-Wno-psabi", src,
                                "-o", exe], capture_output=True)
        if built.returncode != 0:
            return 0.0
        done = subprocess.run([exe, str(mib), str(threads), str(repeats)],
                              capture_output=True, text=True)
        return float(done.stdout) if done.returncode == 0 else 0.0


def measure_bandwidth(mib: int = 512, repeats: int = 7) -> dict:
    """Memory bandwidth in bytes/s, best of ``repeats``: ``copy`` (read + write bytes, one
    thread), ``read_1`` (one thread summing the array) and ``read`` (every core summing its
    own slice at once: numpy's reductions release the GIL), ``read_native`` (every core
    streaming with vector loads, benchmarks/read_probe.c; 0 without a C compiler: numpy's
    float32 sum is too slow per core to reach the bound on a busy machine). ``bound`` is
    the highest all-core read, the machine's limit for a decode that streams its weights;
    llama.cpp's float32 decode was seen at 1.4x the one-thread figure, so one thread is no
    limit."""
    a = np.ones(mib * 2**20 // 4, dtype=np.float32)
    b = np.empty_like(a)
    threads = os.cpu_count() or 1
    slices = np.array_split(a, threads)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(np.sum, slices))  # start the threads and touch every page first
        read = a.nbytes / _best_seconds(lambda: list(pool.map(np.sum, slices)), repeats)
    copy = 2 * a.nbytes / _best_seconds(lambda: np.copyto(b, a), repeats)
    read_1 = a.nbytes / _best_seconds(a.sum, repeats)
    native = native_read(mib, threads, repeats)
    return {"copy": copy, "read_1": read_1, "read": read, "read_native": native,
            "threads": threads, "bound": max(read, read_1, native)}


def machine_facts() -> dict:
    """CPU, core count and the load average now (call again at the end for the second)."""
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "load_start": load_average()}


def describe(facts: dict, bandwidth: dict) -> str:
    """One line: CPU, cores, the bandwidths, the load at the start and the end."""
    end = facts.get("load_end")
    native = bandwidth.get("read_native", 0.0)
    vector = f", {native / 1e9:.1f} GB/s with vector loads" if native else ""
    return (f"{facts['cpu']}, {facts['cpus']} CPUs; memory read {bandwidth['read'] / 1e9:.1f} GB/s"
            f" with {bandwidth['threads']} threads{vector} ({bandwidth['read_1'] / 1e9:.1f} GB/s "
            f"one thread, copy {bandwidth['copy'] / 1e9:.1f} GB/s); load average "
            f"{facts['load_start']:.2f} at the start, "
            f"{'-' if end is None else f'{end:.2f}'} at the end")
