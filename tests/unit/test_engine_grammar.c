/* test_engine_grammar.c — constrained decoding in the engine on models/default (a tiny model trained on
 * Python source that never saw a tool call or a JSON answer, so the grammar does the work): for many seeds
 * the answer parses and satisfies its JSON Schema; a forced tool call comes out of the tool-call parser with
 * the tool's name and arguments valid for its schema; a greedy unconstrained request running in the same
 * batch keeps its solo output; a bad schema is refused at submit with the keyword named. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cinfer.h"
#include "test.h"

static cinfer_model *open_default(void) {
    char err[1024];
    cinfer_model *m = NULL;
    if (cinfer_model_open("models/default", &m, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return NULL;
    }
    return m;
}

static cinfer_engine *engine(cinfer_model *m, int max_seqs) {
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.max_seqs = max_seqs;
    ep.ctx_size = 1024;
    ep.n_threads = 2;
    cinfer_engine *e = NULL;
    char err[1024];
    if (cinfer_engine_create(m, &ep, &e, err, sizeof err)) test_fail(__FILE__, __LINE__, "%s", err);
    return e;
}

typedef struct {
    char text[16384];
    size_t len;
    char tool_name[64];
    char args[4096];
    size_t args_len;
    int n_calls;
    char finish[32];
    int32_t ids[600];
    int n_ids;
} out_t;

static void drain(cinfer_request *r, out_t *o) {
    memset(o, 0, sizeof *o);
    cinfer_event ev;
    while (cinfer_request_next(r, &ev, 60000) == 1) {
        if (ev.type == CINFER_EV_CONTENT && o->len + ev.len < sizeof o->text) {
            memcpy(o->text + o->len, ev.text, ev.len);
            o->len += ev.len;
        }
        if (ev.type == CINFER_EV_LOGPROB && o->n_ids < 600) o->ids[o->n_ids++] = ev.token;
        if (ev.type == CINFER_EV_TOOL_CALL) {
            if (ev.tool_name) {
                o->n_calls++;
                snprintf(o->tool_name, sizeof o->tool_name, "%s", ev.tool_name);
            }
            if (ev.tool_args && o->args_len + ev.tool_args_len < sizeof o->args) {
                memcpy(o->args + o->args_len, ev.tool_args, ev.tool_args_len);
                o->args_len += ev.tool_args_len;
            }
        }
        if (ev.type == CINFER_EV_DONE) snprintf(o->finish, sizeof o->finish, "%s", ev.finish_reason);
        if (ev.type == CINFER_EV_ERROR) snprintf(o->finish, sizeof o->finish, "error");
    }
}

static const char SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"n\":{\"type\":"
    "\"integer\"},\"ok\":{\"type\":\"boolean\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\","
    "\"b\","
    "\"c\"]},\"maxItems\":3},\"kind\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"number\"}]}},\"required\":["
    "\"name\",\"n\",\"ok\"],\"additionalProperties\":false}";

/* The checks SCHEMA asks for. */
static int valid(const char *text, size_t len, char *why, size_t whylen) {
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    if (!j) return snprintf(why, whylen, "not JSON: %s", je.text), 0;
    int ok = json_is_object(j) && json_is_string(json_object_get(j, "name")) &&
             json_is_integer(json_object_get(j, "n")) && json_is_boolean(json_object_get(j, "ok"));
    const json_t *name = json_object_get(j, "name"), *tags = json_object_get(j, "tags"),
                 *kind = json_object_get(j, "kind");
    /* maxLength counts characters */
    if (ok) {
        const char *s = json_string_value(name);
        int chars = 0;
        for (; *s; s++) chars += ((unsigned char)*s & 0xC0) != 0x80;
        ok = chars <= 12;
    }
    if (ok && tags) {
        ok = json_is_array(tags) && json_array_size(tags) <= 3;
        size_t i;
        const json_t *t;
        json_array_foreach(tags, i, t) ok &=
            json_is_string(t) && strlen(json_string_value(t)) == 1 && strchr("abc", json_string_value(t)[0]);
    }
    if (ok && kind) ok = json_is_null(kind) || json_is_number(kind);
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) ok &=
        !strcmp(k, "name") || !strcmp(k, "n") || !strcmp(k, "ok") || !strcmp(k, "tags") || !strcmp(k, "kind");
    if (!ok) snprintf(why, whylen, "does not satisfy the schema");
    json_decref(j);
    return ok;
}

TEST(engine_grammar_json_schema_many_seeds) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    cinfer_engine *e = engine(m, 4);
    REQUIRE(e);
    char err[1024];
    int32_t *p;
    int np;
    REQUIRE(cinfer_tokenize(m, "Give me a JSON record:", 22, 0, &p, &np, err, sizeof err) == 0);
    enum { N = 16, BATCH = 4 };
    int good = 0;
    for (int base = 0; base < N; base += BATCH) {
        cinfer_request *r[BATCH];
        for (int i = 0; i < BATCH; i++) {
            cinfer_request_params rp;
            memset(&rp, 0, sizeof rp);
            rp.prompt = p;
            rp.n_prompt = np;
            rp.max_tokens = 600;
            rp.sampling = cinfer_sampling_default();
            rp.sampling.temperature = 1.0f;
            rp.sampling.seed = 1000 + (uint64_t)(base + i);
            rp.sampling.has_seed = 1;
            rp.sampling.n_logprobs = -1;
            rp.skip_special_tokens = 1;
            rp.constraint = CINFER_CONSTRAIN_JSON;
            rp.constraint_arg = SCHEMA;
            REQUIRE(cinfer_engine_submit(e, &rp, &r[i], err, sizeof err) == 0);
        }
        for (int i = 0; i < BATCH; i++) {
            out_t *o = malloc(sizeof *o);
            drain(r[i], o);
            cinfer_request_free(r[i]);
            char why[200] = "";
            int ok = !strcmp(o->finish, "stop") && valid(o->text, o->len, why, sizeof why);
            CHECK_MSG(ok, "seed %d: finish %s, %s: %.*s", base + i, o->finish, why, (int)o->len, o->text);
            good += ok;
            free(o);
        }
    }
    CHECK_EQ_INT(good, N);
    /* json_object: any object */
    cinfer_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = p;
    rp.n_prompt = np;
    rp.max_tokens = 300;
    rp.sampling = cinfer_sampling_default();
    rp.sampling.temperature = 0;
    rp.sampling.n_logprobs = -1;
    rp.skip_special_tokens = 1;
    rp.constraint = CINFER_CONSTRAIN_JSON;
    cinfer_request *r;
    REQUIRE(cinfer_engine_submit(e, &rp, &r, err, sizeof err) == 0);
    out_t *o = malloc(sizeof *o);
    drain(r, o);
    cinfer_request_free(r);
    if (!strcmp(o->finish, "stop")) {
        json_t *j = json_loadb(o->text, o->len, 0, NULL);
        CHECK_MSG(json_is_object(j), "json_object answer: %.*s", (int)o->len, o->text);
        json_decref(j);
    } else {
        /* an unbounded grammar may run to max_tokens; it must still be a prefix of an object */
        CHECK_MSG(!strcmp(o->finish, "length") && o->len > 0 && o->text[0] == '{', "finish %s: %.*s",
                  o->finish, (int)o->len, o->text);
    }
    free(o);
    free(p);
    cinfer_engine_destroy(e);
    cinfer_model_close(m);
}

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":10},\"days\":{\"type\":\"integer\"},"
    "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]}},\"required\":[\"city\",\"days\"]}}"
    "},"
    "{\"type\":\"function\",\"function\":{\"name\":\"lookup\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"q\":{\"type\":\"string\",\"maxLength\":8}},\"required\":[\"q\"]}}}]";

TEST(engine_grammar_tool_calls_and_neighbours) {
    cinfer_model *m = open_default();
    REQUIRE(m);
    cinfer_engine *e = engine(m, 4);
    REQUIRE(e);
    char err[1024];
    int32_t *p;
    int np;
    REQUIRE(cinfer_tokenize(m, "What is the weather in Paris?", 29, 0, &p, &np, err, sizeof err) == 0);
    /* the unconstrained neighbour, alone first */
    cinfer_request_params gp;
    memset(&gp, 0, sizeof gp);
    gp.prompt = p;
    gp.n_prompt = np;
    gp.max_tokens = 40;
    gp.sampling = cinfer_sampling_default();
    gp.sampling.temperature = 0;
    gp.sampling.n_logprobs = 0;
    gp.ignore_eos = 1;
    gp.skip_special_tokens = 1;
    cinfer_request *r;
    REQUIRE(cinfer_engine_submit(e, &gp, &r, err, sizeof err) == 0);
    out_t *solo = malloc(sizeof *solo), *o = malloc(sizeof *o), *nb = malloc(sizeof *nb);
    drain(r, solo);
    cinfer_request_free(r);
    for (int xml = 1; xml >= 0; xml--) {
        for (int seed = 0; seed < 4; seed++) {
            cinfer_request_params rp;
            memset(&rp, 0, sizeof rp);
            rp.prompt = p;
            rp.n_prompt = np;
            rp.max_tokens = 400;
            rp.sampling = cinfer_sampling_default();
            rp.sampling.temperature = 1.0f;
            rp.sampling.seed = (uint64_t)seed;
            rp.sampling.has_seed = 1;
            rp.sampling.n_logprobs = -1;
            rp.skip_special_tokens = 1;
            rp.tool_format = xml ? CINFER_TOOLS_QWEN_XML : CINFER_TOOLS_HERMES_JSON;
            rp.tools_json = TOOLS;
            rp.constraint = CINFER_CONSTRAIN_TOOL_CALLS;
            rp.constraint_arg = "get_weather";
            cinfer_request *rc, *rn;
            REQUIRE(cinfer_engine_submit(e, &rp, &rc, err, sizeof err) == 0);
            REQUIRE(cinfer_engine_submit(e, &gp, &rn, err, sizeof err) == 0);
            drain(rc, o);
            drain(rn, nb);
            cinfer_request_free(rc);
            cinfer_request_free(rn);
            CHECK_MSG(!strcmp(o->finish, "tool_calls"), "xml %d seed %d: finish %s, content %.*s", xml, seed,
                      o->finish, (int)o->len, o->text);
            CHECK_EQ_INT(o->n_calls, 1);
            CHECK(!strcmp(o->tool_name, "get_weather"));
            json_t *a = json_loadb(o->args, o->args_len, 0, NULL);
            CHECK_MSG(json_is_object(a), "arguments: %.*s", (int)o->args_len, o->args);
            if (a) {
                const json_t *city = json_object_get(a, "city"), *days = json_object_get(a, "days"),
                             *unit = json_object_get(a, "unit");
                CHECK_MSG(json_is_string(city) && json_is_integer(days), "arguments: %.*s", (int)o->args_len,
                          o->args);
                if (unit)
                    CHECK(json_is_string(unit) && (!strcmp(json_string_value(unit), "celsius") ||
                                                   !strcmp(json_string_value(unit), "fahrenheit")));
            }
            json_decref(a);
            /* the neighbour is untouched by the mask */
            CHECK_EQ_INT(nb->n_ids, solo->n_ids);
            CHECK(!memcmp(nb->ids, solo->ids, sizeof(int32_t) * (size_t)solo->n_ids));
        }
    }
    /* "required": at least one call, of any tool */
    cinfer_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = p;
    rp.n_prompt = np;
    rp.max_tokens = 2000; /* up to 8 calls: the trained model, unlike a random one, likes to go on calling */
    rp.sampling = cinfer_sampling_default();
    rp.sampling.temperature = 0.7f;
    rp.sampling.seed = 9;
    rp.sampling.has_seed = 1;
    rp.sampling.n_logprobs = -1;
    rp.skip_special_tokens = 1;
    rp.tool_format = CINFER_TOOLS_QWEN_XML;
    rp.tools_json = TOOLS;
    rp.constraint = CINFER_CONSTRAIN_TOOL_CALLS;
    REQUIRE(cinfer_engine_submit(e, &rp, &r, err, sizeof err) == 0);
    drain(r, o);
    cinfer_request_free(r);
    CHECK_MSG(o->n_calls >= 1 && !strcmp(o->finish, "tool_calls"), "required: %d calls, finish %s",
              o->n_calls, o->finish);
    /* refusals at submit */
    rp.constraint_arg = "nope";
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &r, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "nope");
    rp.constraint = CINFER_CONSTRAIN_JSON;
    rp.constraint_arg = "{\"type\":\"string\",\"format\":\"email\"}";
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &r, err, sizeof err), CINFER_EINVAL);
    CHECK_STR_CONTAINS(err, "'format'");
    free(solo), free(o), free(nb);
    free(p);
    cinfer_engine_destroy(e);
    cinfer_model_close(m);
}
