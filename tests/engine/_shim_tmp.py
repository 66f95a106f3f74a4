import sys, types
from pathlib import Path
if 'execstate.model.registry' not in sys.modules:
    try:
        import execstate.model.registry
    except ImportError:
        m = types.ModuleType('execstate.model.registry'); m.resolve_model = lambda p: Path(p); sys.modules['execstate.model.registry'] = m
