"""C++ kernels for the CPU, built on first use (`build.py`) and exposed as torch ops
(`ops.py`) so that eager code and torch.compile'd graphs call them alike."""
