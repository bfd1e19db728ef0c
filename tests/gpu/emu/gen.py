# Rewrites a .cu file of src/cuda for the CPU emulation (run.sh): kernel launches become
# emu::launch(&kernel, grid, block, smem, stream)(args), extern __shared__ arrays become the
# launch's dynamic shared buffer, 16-byte vector casts are alignment-checked.
import re, sys
src, dst = sys.argv[1], sys.argv[2]
s = open(src).read()
s = s.replace('#include <mma.h>', '#include "emu_mma.h"')
s = re.sub(r'extern __shared__ (?:__align__\(\d+\) )?([\w:]+(?: [\w:]+)?) (\w+)\[\];',
           lambda m: f'{m.group(1)}* {m.group(2)} = reinterpret_cast<{m.group(1)}*>(emu::dynamic_smem());', s)
n = [0]
def rep(m):
    n[0] += 1
    return f'emu::launch(&{m.group(1)}, {m.group(2)})'
s = re.sub(r'([A-Za-z_][\w:]*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>', rep, s, flags=re.S)
s = s.replace('reinterpret_cast<const uint4*>', 'emu::a16<const uint4>').replace('reinterpret_cast<uint4*>', 'emu::a16<uint4>')
open(dst, 'w').write(s)
print(src, 'launches:', n[0])
