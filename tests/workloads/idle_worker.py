"""A stand-in DataLoader worker: a process named ``pt_data_worker`` (as torch
names its workers) with two extra threads, so three to re-pin. Prints ``ready``
once its threads run, then idles until its stdin closes.

Example::

    w = subprocess.Popen([sys.executable, IDLE_WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert w.stdout.readline().strip() == "ready"

Overhead: none while it idles.
"""
import ctypes
import sys
import threading

ctypes.CDLL(None).prctl(15, b"pt_data_worker", 0, 0, 0)      # PR_SET_NAME
stop = threading.Event()
threads = [threading.Thread(target=stop.wait) for _ in range(2)]
for t in threads:
    t.start()
print("ready", flush=True)
sys.stdin.read()
stop.set()
