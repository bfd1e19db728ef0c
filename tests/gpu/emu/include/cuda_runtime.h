#pragma once
#include "emu_device.hpp"
