// Reads a JSON list of ScaledObjects on stdin; prints "ok" or "invalid: ..." for each, as
// @kubernetes-models/keda (KEDA's API types, generated from its Go API) validates them.
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1";
import fs from "fs";

for (const doc of JSON.parse(fs.readFileSync(0, "utf8"))) {
  try {
    new ScaledObject(doc).validate();
    console.log("ok");
  } catch (error) {
    console.log("invalid: " + error.message.replace(/\n/g, " "));
  }
}
