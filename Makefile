# cinfer — make | make test | make asan | make fuzz | make bench | make install | make format | make clean
#   make          release build: build/libcinfer.a, build/libcinfer.so, build/cinfer
#   make test     the whole suite: release tests, the same tests under ASan+UBSan, a short fuzz run
#   make unit     release tests only (make unit T=name runs the tests whose name contains it)
#   make asan     the tests under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   make fuzz     libFuzzer targets (clang) run FUZZ_SECONDS each on their seed corpora
#   CUDA=1|0      the CUDA backend (src/backend/cuda, sm_90 + compute_90 PTX): on by default when nvcc is found
#                 at $(CUDA_HOME)/bin/nvcc; the same binary runs on the CPU when there is no device
CC      ?= cc
BUILD   ?= build
PKGS    := jansson libpcre2-8 libutf8proc libpng libjpeg libwebp libmicrohttpd
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
ifeq ($(PKG_LIBS),)
PKG_LIBS := -ljansson -lpcre2-8 -lutf8proc -lpng16 -ljpeg -lwebp -lmicrohttpd
endif

WARN    := -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers -Wshadow -Wvla
CFLAGS_COMMON := -std=c11 -D_GNU_SOURCE $(WARN) -Iinclude -Isrc -Itests -I$(BUILD)/gen $(PKG_CFLAGS) -pthread -fPIC -MMD -MP
ifeq ($(SAN),1)
OPT     := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
OPT     ?= -O2 -g
endif
CFLAGS  += $(CFLAGS_COMMON) $(OPT)
LDLIBS  := $(PKG_LIBS) -lgif -lm -lpthread
SANFLAGS := -fsanitize=address,undefined
LDFLAGS += $(if $(filter 1,$(SAN)),$(SANFLAGS))

# CUDA: one library with both backends. asan and fuzz builds stay CPU-only (ASan's shadow mapping and the
# CUDA driver's address reservations do not mix without protect_shadow_gap=0, and the fuzz targets only
# parse): they compile forward_cuda.c without CINFER_CUDA, which makes --device cuda a clear error.
CUDA_HOME ?= /usr/local/cuda
NVCC    ?= $(CUDA_HOME)/bin/nvcc
ifeq ($(SAN),1)
CUDA    := 0
endif
CUDA    ?= $(if $(wildcard $(NVCC)),1,0)
CU_SRC  := $(sort $(wildcard src/backend/cuda/*.cu))
ifeq ($(CUDA),1)
CFLAGS  += -DCINFER_CUDA=1
LDLIBS_CUDA := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lcudart -lstdc++
NVCCFLAGS := -std=c++17 -O3 -Iinclude -Isrc -DCINFER_CUDA=1 \
             -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
             -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter,-fPIC -MMD -MP
LDLIBS  += $(LDLIBS_CUDA)
endif

LIB_SRC  := $(shell find src -name '*.c' ! -path 'src/cli/*' | sort)
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := tests/run.c $(sort $(wildcard tests/unit/*.c tests/parity/*.c))
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
ifeq ($(CUDA),1)
LIB_OBJ  += $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
endif
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)

.PHONY: all test unit asan fuzz fuzz-build bench install format clean e2e
all: $(BUILD)/libcinfer.a $(BUILD)/libcinfer.so $(BUILD)/cinfer

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# The chat page (src/server/web/) is embedded into the binary: each file becomes a byte array
# web_<name> / web_<name>_len in a generated header that src/server/web.c includes. Written with od and sed
# (coreutils, everywhere) rather than xxd, which bare machines such as the GPU one lack.
WEB_SRC := $(sort $(wildcard src/server/web/*.html src/server/web/*.css src/server/web/*.js))
$(BUILD)/gen/web_assets.h: $(WEB_SRC)
	@mkdir -p $(dir $@)
	@for f in $(WEB_SRC); do n=web_$$(basename $$f | tr '.-' '__'); \
	  printf 'static const unsigned char %s[] = {\n' $$n; \
	  od -An -v -tx1 $$f | sed 's/ \([0-9a-f][0-9a-f]\)/0x\1,/g'; \
	  printf '};\nstatic const unsigned int %s_len = %s;\n' $$n $$(wc -c < $$f); done > $@.tmp && mv $@.tmp $@
$(BUILD)/obj/src/server/web.o $(BUILD)/fuzz/obj/src/server/web.o: $(BUILD)/gen/web_assets.h

$(BUILD)/libcinfer.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libcinfer.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDFLAGS) $(LDLIBS)

$(BUILD)/cinfer: $(CLI_OBJ) $(BUILD)/libcinfer.a
	$(CC) -o $@ $(CLI_OBJ) $(BUILD)/libcinfer.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/cinfer-tests: $(TEST_OBJ) $(BUILD)/libcinfer.a
	$(CC) -o $@ $(TEST_OBJ) $(BUILD)/libcinfer.a $(LDFLAGS) $(LDLIBS)

# Tests run from the repository root (fixtures are found at tests/fixtures); CINFER_BIN lets the CLI
# tests find the binary of the same build.
unit: all $(BUILD)/cinfer-tests
	CINFER_BIN=$(BUILD)/cinfer $(BUILD)/cinfer-tests $(T)

asan:
	$(MAKE) BUILD=build-asan SAN=1 CUDA=0 unit

FUZZ_SECONDS ?= 20
FUZZ_CC ?= clang
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -O1 -g -Iinclude -Isrc -I$(BUILD)/gen $(PKG_CFLAGS) -Wno-unused-parameter
FUZZ_OBJ := $(LIB_SRC:%.c=$(BUILD)/fuzz/obj/%.o)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/%)

# The library is compiled once with coverage + sanitizers, then each target links against it.
$(BUILD)/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,address,undefined -c $< -o $@

$(BUILD)/fuzz/libcinfer-fuzz.a: $(FUZZ_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(BUILD)/fuzz/libcinfer-fuzz.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer,address,undefined -o $@ $< $(BUILD)/fuzz/libcinfer-fuzz.a $(LDLIBS)

fuzz-build: $(FUZZ_BIN)

fuzz: fuzz-build
	@for f in $(FUZZ_SRC); do n=$$(basename $$f .c); c=tests/fuzz/corpus/$${n#fuzz_}; \
	  mkdir -p $(BUILD)/fuzz/corpus-$$n; \
	  echo "== $$n ($(FUZZ_SECONDS)s)"; \
	  $(BUILD)/fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -print_final_stats=0 \
	    $(BUILD)/fuzz/corpus-$$n $$c > $(BUILD)/fuzz/$$n.log 2>&1 || { tail -n 40 $(BUILD)/fuzz/$$n.log; exit 1; }; \
	  tail -n 1 $(BUILD)/fuzz/$$n.log; done

test:
	$(MAKE) unit
	$(MAKE) asan
	$(MAKE) fuzz FUZZ_SECONDS=$${FUZZ_SECONDS:-15}
	$(MAKE) e2e
	$(MAKE) BUILD=build-asan SAN=1 CUDA=0 e2e

# End-to-end: tests/e2e/run.mjs drives live servers with the official OpenAI and Anthropic SDKs
# (scripts/install-deps.sh installs them): once against cinfer-mock-serve, the HTTP layer over a
# stand-in engine (tests/e2e/mock_engine.c: fast, scripted tool calls, a load delay for the 503 test),
# then against `cinfer serve` on models/default.
E2E_SRC := tests/e2e/serve_main.c tests/e2e/mock_engine.c src/cli/serve.c src/cli/args.c \
           $(filter src/server/% src/util/%,$(LIB_SRC))
$(BUILD)/cinfer-mock-serve: $(E2E_SRC) $(wildcard src/server/*.h) $(BUILD)/gen/web_assets.h
	@mkdir -p $(BUILD)
	$(CC) $(filter-out -MMD -MP,$(CFLAGS)) -o $@ $(E2E_SRC) $(LDFLAGS) $(LDLIBS)

$(BUILD)/cinfer-serve: tests/e2e/serve_main.c $(BUILD)/obj/src/cli/serve.o $(BUILD)/obj/src/cli/args.o $(BUILD)/libcinfer.a
	$(CC) $(filter-out -MMD -MP,$(CFLAGS)) -o $@ $^ $(LDFLAGS) $(LDLIBS)

e2e: $(BUILD)/cinfer-mock-serve $(BUILD)/cinfer-serve
	node tests/e2e/run.mjs --mock --bin $(BUILD)/cinfer-mock-serve
	node tests/e2e/run.mjs --no-verb --bin $(BUILD)/cinfer-serve --model models/default
	node tests/e2e/browser.mjs --bin $(BUILD)/cinfer-serve --model models/default

bench: all
	bench/run.sh

PREFIX ?= /usr/local
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include
	install -m 755 $(BUILD)/cinfer $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(BUILD)/libcinfer.a $(BUILD)/libcinfer.so $(DESTDIR)$(PREFIX)/lib/
	install -m 644 include/cinfer.h $(DESTDIR)$(PREFIX)/include/

format:
	clang-format -i $$(find src tests include -name '*.[ch]')

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
