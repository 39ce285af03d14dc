"""The advisor: a calibrated cost model of text vs cache hops, and the decision it suggests.

Measuring a calibration runs real handoffs, so it lives above them, in :mod:`c2c.bench.calibrate`.
"""

from c2c.advise.cost_model import (Advice, Calibration, advise, calibration_name, calibration_path,
                                   load_calibration, runtime_calibration_name, save_calibration)

__all__ = ["Advice", "Calibration", "advise", "calibration_name", "calibration_path", "load_calibration",
           "runtime_calibration_name", "save_calibration"]
